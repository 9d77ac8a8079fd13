"""The tools/: every one starts and documents itself; the shared harness runs a child in
the one measuring environment and reports repeated figures one way; every living benchmark
runs on tiny shapes and prints sane figures (slow)."""

import json
import re
import runpy
import subprocess
import sys
import time
from pathlib import Path

import pytest

TOOLS = Path(__file__).resolve().parents[2] / "tools"
REAL = Path(__file__).resolve().parents[1] / "data" / "realspeech"
SCRIPTS = sorted(p for p in TOOLS.glob("*.py") if p.name != "harness.py")


@pytest.mark.parametrize("script", SCRIPTS, ids=[p.stem for p in SCRIPTS])
def test_every_tool_answers_help(script, monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", [str(script), "--help"])
    monkeypatch.syspath_prepend(str(TOOLS))
    with pytest.raises(SystemExit) as done:
        runpy.run_path(str(script), run_name="__main__")
    assert done.value.code == 0
    out = capsys.readouterr().out
    assert "usage:" in out and len(out.splitlines()) > 2


def test_the_harness_runs_a_child_in_the_measuring_environment(tmp_path):
    sys.path.insert(0, str(TOOLS))
    try:
        from harness import CHILD_ENV, run_child
    finally:
        sys.path.remove(str(TOOLS))
    child = tmp_path / "child.py"
    child.write_text(
        "import os, sys\n"
        f"sys.path.insert(0, {str(TOOLS)!r})\n"
        "from harness import child_request, reply\n"
        "request = child_request()\n"
        "reply({'twice': request['n'] * 2, 'bfc': os.environ['TF_CPU_ALLOCATOR_USE_BFC']})\n"
    )
    assert run_child(str(child), {"n": 21}) == {"twice": 42, "bfc": "true"}
    assert CHILD_ENV["TF_CPU_ALLOCATOR_USE_BFC"] == "true"
    child.write_text("import sys\nsys.stderr.write('broken on purpose\\n')\nsys.exit(3)\n")
    with pytest.raises(RuntimeError, match="broken on purpose"):
        run_child(str(child), {})


def _run(*args: str) -> str:
    run = subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-2000:]
    return run.stdout


def _figures(pattern: str, out: str) -> list[float]:
    """Every number the regex's first group catches in `out` (at least one)."""
    found = [float(x) for x in re.findall(pattern, out)]
    assert found, f"no {pattern!r} in:\n{out}"
    return found


def test_the_harness_reports_median_and_range():
    sys.path.insert(0, str(TOOLS))
    try:
        from harness import spread, timed
    finally:
        sys.path.remove(str(TOOLS))
    assert spread([3.0, 1.0, 2.0, 10.0]) == (2.5, 1.0, 10.0)
    assert spread([0.5]).format(".2f") == "0.50 (0.50-0.50)"
    calls = []
    figure = timed(lambda: calls.append(1), repeats=4, warmup=2)
    assert len(calls) == 6 and 0 <= figure.low <= figure.median <= figure.high < 1


def test_update_times_times_each_window_of_one_fit_epoch():
    import numpy as np
    import tensorflow as tf

    from asrkit.models.transducer import Transducer
    from asrkit.training.optimizers import build_optimizer
    from asrkit.training.task import TransducerTask
    from tests.tiny import tiny_model_config

    sys.path.insert(0, str(TOOLS))
    try:
        from harness import update_times
    finally:
        sys.path.remove(str(TOOLS))
    rng = np.random.default_rng(0)
    micro = (rng.standard_normal((2, 32, 80)).astype(np.float32), np.array([32, 20]),
             np.array([[1, 2], [3, 0]], np.int32), np.array([2, 1]))  # fmt: skip
    task = TransducerTask(Transducer(9, tiny_model_config()))
    task.compile(build_optimizer("adamw", 1e-3, 0.01), accumulation_steps=2)
    window = tf.data.Dataset.from_tensors(micro).repeat(2)  # one update's two micro-batches
    task.fit(window, verbose=0)
    assert int(task.optimizer.iterations.numpy()) == 1
    start = time.perf_counter()
    figure = update_times(task, window, 3, warmup=2)
    elapsed = time.perf_counter() - start
    # two untimed updates, then three timed once each, within the call's own time
    assert int(task.optimizer.iterations.numpy()) == 6
    assert 0 < figure.low <= figure.median <= figure.high and 3 * figure.low < elapsed


# The living benchmarks, each on tiny shapes: figures present and sane.


@pytest.mark.slow
def test_bench_rnnt_loss_prints_time_and_memory_per_implementation():
    out = _run(str(TOOLS / "bench_rnnt_loss.py"), "--shapes", "2,12,4,16", "--reps", "1")
    rows = re.findall(
        r"2,12,4,16 +(asrkit|autodiff) +(True|False) +([\d.]+) +([\d.]+) +([\d.]+)", out
    )
    assert len(rows) == 4 and "failed" not in out, out
    assert all(float(s) < 60 and float(times) > 0 for *_, s, _, times in rows)


@pytest.mark.slow
def test_bench_joint_prints_memory_per_mode():
    out = _run(str(TOOLS / "bench_joint.py"), "--batch", "1", "--seconds", "1", "--labels", "4",
               "--vocab", "16", "--modes", "fused,pruned", "--steps", "1",
               "--set", "model.encoder.num_blocks=1")  # fmt: skip
    assert "fused" in out and "pruned" in out
    assert all(0 < x < 4096 for x in _figures(r"([\d.]+) MiB", out))


@pytest.mark.slow
def test_bench_accumulation_shows_asrkit_exact_and_keras_not():
    out = _run(str(TOOLS / "bench_accumulation.py"), "--tables", "3")
    asrkit = _figures(r"asrkit:\s*([\d.e+-]+)", out)[0]
    keras = _figures(r"gradient_accumulation_steps:\s*([\d.e+-]+)", out)[0]
    assert asrkit < 1e-6 < 1e-3 < keras, out  # exact against Keras' per-micro-batch means


@pytest.mark.slow
def test_bench_model_prints_parameters_and_step_time():
    out = _run(str(TOOLS / "bench_model.py"), "--models", "mini_lstm,mini_conformer",
               "--batch", "1", "--seconds", "1", "--labels", "4", "--repeats", "2")  # fmt: skip
    params = _figures(r"([\d.]+) M parameters", out)
    assert len(params) == 2 and all(0.1 < p < 10 for p in params)  # the mini models: ~1 M
    assert all(0 < t < 60 for t in _figures(r"parameters, ([\d.]+) \(", out))


@pytest.mark.slow
def test_bench_pipeline_prints_rates_and_padding(tmp_path):
    out = _run(str(TOOLS / "bench_pipeline.py"), "--corpus", str(REAL), "--part", "test-real",
               "--work", str(tmp_path), "--vocab", "30", "--batch-seconds", "20",
               "--repeats", "1")  # fmt: skip
    assert 0 < _figures(r"RTF ([\d.]+)", out)[0] < 1
    sizes = _figures(r"\(([\d.]+)x the FLAC\)", out)  # features (3 speeds), then audio
    assert len(sizes) == 2 and sizes[0] > 2.5 * sizes[1] and 0.8 < sizes[1] < 1.2
    assert len(_figures(r"h: (\d+) \(", out)) == 2 and all(_figures(r"h: (\d+) \(", out))
    assert _figures(r"front end\): (\d+) \(", out)[0] > 0
    efficiencies = _figures(r"(?:bucketed|max) ([\d.]+)", out)
    assert len(efficiencies) == 3 and all(0 < e <= 1 for e in efficiencies)


@pytest.fixture(scope="module")
def tiny_experiment(tmp_path_factory):
    from tests.test_export import make_experiment
    from tests.tiny import tiny_model_config

    work, exp, _ = make_experiment(tmp_path_factory.mktemp("bench"), tiny_model_config())
    return exp, work / "data" / "test-real.jsonl"


def test_random_experiment_is_the_config_reshaped_with_a_favoured_blank(tiny_experiment, tmp_path):
    """The new experiment records the overrides, decodes, and its weights are the same
    seed's network but for the bias added to the blank output."""
    from asrkit.checkpoints import read_weights
    from asrkit.experiment import load_experiment, load_experiment_config

    exp, _ = tiny_experiment
    made = {}
    for bias in (0.0, 2.5):
        out = tmp_path / f"b{bias}"
        _run(str(TOOLS / "random_experiment.py"), "--from", str(exp), "--out", str(out),
             "--set", "model.joint_dim=24", "--blank-bias", str(bias))  # fmt: skip
        assert load_experiment_config(out).model.joint_dim == 24
        made[bias] = read_weights(out / "checkpoints" / "ckpt-00000000")
    load_experiment(out)  # a working experiment
    differ = {k for k in made[0.0] if not (made[0.0][k] == made[2.5][k]).all()}
    [bias] = differ
    assert bias.startswith("joint.output_layer") and bias.endswith("bias")
    delta = made[2.5][bias] - made[0.0][bias]
    assert delta[0] == 2.5 and not delta[1:].any()


@pytest.mark.slow
def test_bench_decoding_prints_wer_and_rtf_per_method(tiny_experiment):
    exp, manifest = tiny_experiment
    out = _run(str(TOOLS / "bench_decoding.py"), "--exp-dir", str(exp), "--manifest",
               str(manifest), "--beams", "2", "--repeats", "2")  # fmt: skip
    assert "greedy:" in out and "beam 2:" in out
    assert all(0 <= w <= 100 for w in _figures(r"WER +([\d.]+) %", out))
    assert all(0 < r < 10 for r in _figures(r"RTF ([\d.]+) \(", out))
    assert _figures(r"x([\d.]+)", out) == [1.0, 1.0]  # one experiment: its own ratio


@pytest.mark.slow
def test_bench_streaming_prints_every_runner(tiny_experiment):
    exp, manifest = tiny_experiment
    out = _run(str(TOOLS / "bench_streaming.py"), "--exp-dir", str(exp), "--manifest",
               str(manifest), "--utterances", "2", "--average", "1")  # fmt: skip
    for runner in ("greedy, whole file", "network", "SavedModel", "LiteRT"):
        assert runner in out
    rows = re.findall(r"streaming \d+ ms, \S+ +([\d.]+)% +([\d.]+) +([\d.]+)", out)
    assert len(rows) == 6 and all(0 < float(rtf) < 10 for _, rtf, _ in rows)


@pytest.mark.slow
def test_bench_long_audio_prints_both_wers_and_the_spanning_words(tiny_experiment):
    exp, manifest = tiny_experiment
    out = _run(str(TOOLS / "bench_long_audio.py"), "--exp-dir", str(exp), "--manifest",
               str(manifest), "--count", "4", "--average", "1", "--method", "greedy",
               "--max-seconds", "6", "--context-seconds", "0.5")  # fmt: skip
    assert "4 utterances" in out and "training lengths: not recorded" in out
    per_sentence, long_file = _figures(r"(?:per sentence|long file) ([\d.]+) %", out)
    assert 0 <= per_sentence <= 100 and 0 <= long_file <= 200
    assert int(_figures(r"; (\d+) windows", out)[0]) >= 2  # 4 clips of ~3 s, 6 s segments
    assert _figures(r"words spanning a pause > 1 s: (\d+)", out)[0] >= 0


@pytest.mark.slow
def test_bench_export_memory_prints_the_peak_per_length(tiny_experiment, tmp_path):
    from asrkit.export import export_model

    exp, manifest = tiny_experiment
    saved = export_model(exp, tmp_path / "saved")
    clip = json.loads(manifest.read_text().splitlines()[0])["audio_path"]
    out = _run(str(TOOLS / "bench_export_memory.py"), "--model", str(saved), "--audio", clip,
               "--minutes", "0.1", "0.6")  # fmt: skip
    rows = re.findall(r"^ +([\d.]+) +(\d+) +(\d+) +(-?\d+) +([\d.]+) +(\d+)$", out, re.M)
    assert [float(r[0]) for r in rows] == [0.1, 0.6], out
    assert all(100 < int(r[1]) < 8000 for r in rows)  # MiB: a TensorFlow process
    assert "windows of 30.0 s" in out  # no training lengths recorded: transcribe's 30 s


def test_executed_flops_counts_products_and_convolutions_forward_and_backward(monkeypatch):
    """Each matrix product and convolution costs 2 x its multiply-adds, and its gradient
    twice that again (one product for the input's, one for the weight's): forward +
    backward count 3 x the hand-counted forward, inside a tf.function and a loop too."""
    monkeypatch.syspath_prepend(str(TOOLS))
    import tensorflow as tf
    from bench_throughput import executed_flops

    batch, steps, width, out, kernel = 2, 12, 6, 5, 3
    dense = tf.Variable(tf.random.normal([width, out]))
    conv = tf.Variable(tf.random.normal([1, kernel, width, out]))
    depthwise = tf.Variable(tf.random.normal([1, kernel, width, 1]))
    square = tf.Variable(tf.random.normal([width, width]))

    @tf.function(autograph=False)
    def inner(x):  # a nested function: its graph is called, not inlined
        return tf.einsum("btd,de->bte", x, dense)

    def passes(x):
        with tf.GradientTape() as tape:
            tape.watch(x)
            image = x[:, None]
            y = inner(x)
            y += tf.nn.conv2d(image, conv, strides=1, padding="VALID")[:, 0, :1]
            z = tf.nn.depthwise_conv2d(image, depthwise, strides=[1, 1, 1, 1], padding="SAME")
            scores = tf.matmul(z[:, 0], z[:, 0], transpose_b=True)  # batch matmul
            _, looped = tf.while_loop(
                lambda i, h: i < 4, lambda i, h: (i + 1, tf.matmul(h, square)),
                (0, x[0]),
            )  # fmt: skip
            total = tf.reduce_sum(y) + tf.reduce_sum(scores) + tf.reduce_sum(looped)
        return tape.gradient(total, [x, dense, conv, depthwise, square])

    forward = (
        2 * batch * steps * width * out  # the einsum
        + 2 * batch * (steps - kernel + 1) * out * kernel * width  # the convolution
        + 2 * batch * steps * width * kernel  # the depthwise convolution
        + 2 * batch * steps * steps * width  # the scores
        + 4 * 2 * steps * width * width  # the loop's four products
    )
    assert executed_flops(passes, tf.random.normal([batch, steps, width])) == 3 * forward


@pytest.mark.slow
def test_bench_throughput_prints_the_peak_and_the_achieved_share():
    out = _run(str(TOOLS / "bench_throughput.py"), "--configs", "mini_conformer",
               "--batch", "1", "--seconds", "1", "--labels", "4", "--repeats", "2",
               "--gemm", "256")  # fmt: skip
    peaks = _figures(r"(?m)^peak .* -> ([\d.]+) GFLOP/s$", out)
    assert len(peaks) == 4 and all(p > 0 for p in peaks), out  # 2 dtypes, before and after
    faster = _figures(r"faster peak: float32 ([\d.]+) GFLOP/s", out)
    assert faster == [round(max(peaks[0], peaks[2]))], out
    shares = _figures(r"= ([\d.]+) % of the float32 peak", out)
    assert len(shares) == 6 and all(0 < s < 400 for s in shares), out  # 3 figures x 2 precisions


@pytest.mark.parametrize("argument", ["--configs=tiny_conformer", "--precisions=float64"])
def test_bench_throughput_refuses_an_unknown_config_or_precision(argument):
    run = subprocess.run([sys.executable, str(TOOLS / "bench_throughput.py"), argument],
                         capture_output=True, text=True, timeout=120)  # fmt: skip
    assert run.returncode == 2 and "Traceback" not in run.stderr
    assert f"unknown ['{argument.split('=')[1]}']" in run.stderr


@pytest.mark.parametrize("per_utterance", [0.0, 37.5, 300.0, 5000.0])
def test_the_largest_micro_batch_search_is_the_brute_force_answer(per_utterance, monkeypatch):
    """bench_vs_nemo's `fit` search, on a made-up peak that grows with the utterances (and
    one step of noise): the most utterances within the cap, as trying every count finds it,
    from a handful of probes."""
    monkeypatch.syspath_prepend(str(TOOLS))
    import bench_vs_nemo

    def peak_of(n):  # MiB: a fixed part, a growing part, a wobble that keeps it monotone
        return 1000 + per_utterance * n + (n % 3)

    cap = 4096 * 2**20
    most, peaks = bench_vs_nemo._largest_under(cap, peak_of, limit=256)
    brute = max([n for n in range(1, 257) if peak_of(n) * 2**20 <= cap], default=0)
    assert most == min(brute, 256)
    assert all(peaks[n] == peak_of(n) for n in peaks) and len(peaks) <= 2 * 9 + 1
    assert bench_vs_nemo._parse_cap("6GiB") == 6 * 2**30
    assert bench_vs_nemo._parse_cap("512MiB") == 512 * 2**20
    with pytest.raises(SystemExit):
        bench_vs_nemo._parse_cap("lots")


@pytest.mark.parametrize(("kernel", "kind"), [
    ("_MklMatMul", "matrix products"), ("_MklEinsum", "matrix products"),
    ("aten::addmm", "matrix products"), ("aten::mm", "matrix products"),
    ("aten::bmm", "matrix products"), ("_MklNativeFusedConv2D", "convolutions"),
    ("_MklNativeDepthwiseConv2dNative", "convolutions"),
    ("aten::mkldnn_convolution", "convolutions"), ("aten::native_layer_norm", "norms"),
    ("_MklLayerNorm", "norms"), ("_MklNativeFusedBatchNormV3", "norms"),
    ("_MklSoftmax", "softmax"), ("aten::_softmax", "softmax"), ("Cast", "casts and copies"),
    ("aten::copy_", "casts and copies"), ("Pad", "layout"), ("_MklTranspose", "layout"),
    ("Pack", "layout"), ("SelectV2", "elementwise"), ("_MklSwish", "elementwise"),
    ("aten::silu", "elementwise"), ("AddV2", "elementwise"),
])  # fmt: skip
def test_profile_encoder_sorts_both_sides_kernels_into_the_same_kinds(kernel, kind, monkeypatch):
    """profile_encoder's table puts TensorFlow's and PyTorch's kernels of one kind in one
    row: a product, a convolution, a norm, a softmax, a cast, a layout change, the rest."""
    monkeypatch.syspath_prepend(str(TOOLS))
    import profile_encoder

    assert profile_encoder._kind(kernel) == kind


def test_the_archives_emission_manifest_is_read_as_asrkit_or_nemo_writes_it(
    tmp_path, monkeypatch, capsys
):
    """make_nemo_published's `--emit-like` manifest: asrkit's (`audio_path`) and NeMo's
    (`audio_filepath`) rows, relative paths from the manifest's directory, blank lines
    skipped; a row without audio or text refused naming its line, exit code 2."""
    monkeypatch.syspath_prepend(str(TOOLS))
    import make_nemo_published

    manifest = tmp_path / "m.jsonl"
    manifest.write_text(
        json.dumps({"audio_path": "a.flac", "text": "ONE"}) + "\n\n"
        + json.dumps({"audio_filepath": "/data/b.wav", "text": "two three"}) + "\n"
    )  # fmt: skip
    rows = make_nemo_published._manifest_audio(manifest)
    assert rows == [(str((tmp_path / "a.flac").resolve()), "ONE"), ("/data/b.wav", "two three")]
    manifest.write_text(json.dumps({"audio_path": "a.flac", "text": "x"}) + "\n"
                        + json.dumps({"audio_path": "b.flac"}) + "\n")  # fmt: skip
    with pytest.raises(SystemExit) as stop:
        make_nemo_published._manifest_audio(manifest)
    assert stop.value.code == 2
    assert f"{manifest}:2: wants audio_path" in capsys.readouterr().err


@pytest.mark.slow
def test_bench_boosting_prints_recall_wer_false_alarms_and_time(tiny_experiment, tmp_path):
    """A boost list of a word the first reference says and a distractor: the counts it
    prints are the manifest's (the references that say the word, how often; the others
    are where a false alarm could be)."""
    from asrkit.data.manifest import read_manifest
    from asrkit.metrics import normalize

    exp, manifest = tiny_experiment
    utts = read_manifest(manifest)
    words = [normalize(u.text).split() for u in utts]
    word = max(words[0], key=len)
    (tmp_path / "said.txt").write_text(f"{word}\n")
    (tmp_path / "boost.txt").write_text(f"{word}\nZANZIBAR\n")
    out = _run(str(TOOLS / "bench_boosting.py"), "--exp-dir", str(exp), "--manifest",
               str(manifest), "--boost", str(tmp_path / "boost.txt"), "--said",
               str(tmp_path / "said.txt"), "--weights", "1", "--methods", "greedy",
               "--average", "1", "--timed", "2", "--repeats", "1")  # fmt: skip
    said = sum(w.count(word) for w in words)
    saying = sum(word in w for w in words)
    assert f"{len(utts)} utterances, {saying} with a boosted phrase" in out
    for label in ("no boosting", "boost weight 1"):
        line = next(line for line in out.splitlines() if f"greedy, {label}:" in line)
        assert f"/{said} (" in line and "false alarms " in line
        assert int(re.search(r"false alarms (\d+)/(\d+)", line)[2]) == len(utts) - saying
    assert len(re.findall(r"per call: no boost [\d.]+ \(", out)) == 2


@pytest.mark.slow
def test_bench_lm_fusion_prints_wer_per_setting_recall_and_time(tiny_experiment, tmp_path):
    """An LM of the manifest's own transcripts (`asrkit lm train`): one WER line per search
    and setting (no LM, each LM weight, each with LODR); with `--said`, the counts of the
    said word that the manifest holds; then the time lines. The WER without an LM is what
    `asrkit decode` of the same manifest reports."""
    from asrkit.cli.main import main
    from asrkit.data.manifest import read_manifest
    from asrkit.metrics import normalize

    exp, manifest = tiny_experiment
    arpa, low = tmp_path / "lm.arpa", tmp_path / "low.arpa"
    assert main(["lm", "train", "--tokenizer", str(exp), "--manifest", str(manifest),
                 "--out", str(arpa)]) == 0  # fmt: skip
    assert main(["lm", "train", "--tokenizer", str(exp), "--manifest", str(manifest),
                 "--order", "1", "--out", str(low)]) == 0  # fmt: skip
    words = [normalize(u.text).split() for u in read_manifest(manifest)]
    word = max(words[0], key=len)
    (tmp_path / "said.txt").write_text(f"{word}\n")
    out = _run(str(TOOLS / "bench_lm_fusion.py"), "--exp-dir", str(exp), "--manifest",
               str(manifest), "--lm", str(arpa), "--lodr", str(low), "--lm-weights", "0.3,1",
               "--lodr-weights", "0.1", "--said", str(tmp_path / "said.txt"), "--methods",
               "greedy", "--average", "1", "--timed", "2", "--repeats", "1")  # fmt: skip
    labels = ["no LM", "LM 0.3", "LM 0.3 - LODR 0.1", "LM 1", "LM 1 - LODR 0.1"]
    lines = [line for line in out.splitlines() if line.startswith("greedy, ") and "WER" in line]
    assert [line.split(": WER")[0] for line in lines] == [f"greedy, {x}" for x in labels]
    said = sum(w.count(word) for w in words)
    assert all(f"/{said}, WER without them" in line for line in lines)
    assert len(re.findall(r"per call: no LM [\d.]+ \(", out)) == 2
    report = tmp_path / "decoded"
    assert main(["decode", "--exp-dir", str(exp), "--manifest", str(manifest), "--average", "1",
                 "--out", str(report)]) == 0  # fmt: skip
    wer = json.loads((report / "wer.json").read_text())["wer"]
    assert f"greedy, no LM: WER {100 * wer:.2f} %" in out
