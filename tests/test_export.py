"""The exported SavedModel, loaded in a fresh process that cannot import asrkit, transcribes
real speech exactly as `asrkit decode` and `asrkit transcribe` do."""

import itertools
import json
import re
import subprocess
import sys
from pathlib import Path

import keras
import numpy as np
import pytest
import tensorflow as tf

from asrkit.audio import read_audio
from asrkit.checkpoints import CheckpointManager, TrainState
from asrkit.cli.main import main
from asrkit.config import DataConfig, ExperimentConfig, dump_config
from asrkit.data.librispeech import prepare_librispeech
from asrkit.data.manifest import read_manifest
from asrkit.decoding.recogniser import OUTPUTS, PADDING, Recogniser
from asrkit.decoding.runner import decode_manifest
from asrkit.decoding.transcribe import NetworkRecogniser, transcribe_files
from asrkit.experiment import adopt_assets, build_network, load_experiment, write_timing
from asrkit.export import export_model
from asrkit.features import GlobalNormalizer, log_mel
from asrkit.tokenizer import train_tokenizer
from tests.tiny import tiny_model_config

REAL = Path(__file__).parent / "data" / "realspeech"

WITHOUT_ASRKIT = r"""
import importlib.abc, json, sys

class NoAsrkit(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] == "asrkit":
            raise ImportError("asrkit must not be needed to serve an export")

sys.meta_path.insert(0, NoAsrkit())
import soundfile, tensorflow as tf

loaded = tf.saved_model.load(sys.argv[1])
"""

SERVE_WITHOUT_ASRKIT = (
    WITHOUT_ASRKIT
    + r"""
serve, serve_batch = loaded.signatures["serving_default"], loaded.signatures["serve_batch"]

def plain(value):
    value = value.numpy()
    if isinstance(value, bytes):
        return value.decode()
    if value.dtype == object:
        return json.loads(json.dumps(value.tolist(), default=bytes.decode))
    return value.tolist()

audio = []
for path in sys.argv[2:]:
    samples, rate = soundfile.read(path, dtype="float32")
    assert rate == 16000, rate
    audio.append(samples)
single = [{k: plain(v) for k, v in serve(waveform=tf.constant(a)).items()} for a in audio]
lengths = [len(a) for a in audio]
padded = [list(a) + [0.0] * (max(lengths) - len(a)) for a in audio]
batch = serve_batch(waveforms=tf.constant(padded), lengths=tf.constant(lengths))
batch = {k: plain(v) for k, v in batch.items()}
assert not any(m.split(".")[0] == "asrkit" for m in sys.modules)
print(json.dumps({"single": single, "batch": batch}))
"""
)


@pytest.fixture(scope="module")
def experiment(tmp_path_factory):
    """An untrained tiny transducer with a real tokenizer and CMVN; its output bias is moved
    away from blank so that it emits plenty of tokens on real speech."""
    return make_experiment(tmp_path_factory.mktemp("export"), tiny_model_config())


@pytest.fixture(scope="module")
def chunked_experiment(tmp_path_factory):
    """The same with a chunked (streaming) Conformer: 2 blocks, chunks of 4 frames, 1 back."""
    import dataclasses

    from asrkit.config import EncoderConfig

    encoder = EncoderConfig(kind="conformer", d_model=16, num_blocks=2, num_heads=2,
                            kernel_size=5, subsampling_filters=8, dropout=0.0, chunk_frames=4,
                            left_chunks=1)  # fmt: skip
    config = dataclasses.replace(tiny_model_config(), encoder=encoder)
    return make_experiment(tmp_path_factory.mktemp("chunked"), config)


def test_a_dynamic_chunk_model_loads_at_the_chunk_asked_for(tmp_path):
    """`--chunk-frames`: the experiment's weights run with chunks of N frames (0: full
    context) = the same weights in a network configured with that chunk; a model trained
    without dynamic chunks, or a negative size, is refused with a message (exit 2 path)."""
    import dataclasses

    from asrkit.config import EncoderConfig
    from asrkit.errors import InputError

    encoder = EncoderConfig(kind="conformer", d_model=16, num_blocks=2, num_heads=2,
                            kernel_size=5, subsampling_filters=8, dropout=0.0, chunk_frames=4,
                            dynamic_chunks=8)  # fmt: skip
    _, exp, utts = make_experiment(
        tmp_path / "dynamic", dataclasses.replace(tiny_model_config(), encoder=encoder)
    )
    features = log_mel(read_audio(utts[0].audio_path))[None]
    lengths = np.array([features.shape[1]])
    trained = load_experiment(exp)
    default = trained.network.encode(features, lengths)[0].numpy()
    for chunk in (2, 0):
        got = load_experiment(exp, chunk_frames=chunk).network.encode(features, lengths)[0]
        fixed = dataclasses.replace(encoder, chunk_frames=chunk or 10_000)
        reference = build_network(
            ExperimentConfig(model=dataclasses.replace(tiny_model_config(), encoder=fixed)),
            trained.tokenizer.vocab_size,
        )
        reference.set_weights(trained.network.get_weights())
        want = reference.encode(features, lengths)[0].numpy()
        np.testing.assert_allclose(got.numpy(), want, atol=1e-5)
        assert not np.allclose(got.numpy(), default, atol=1e-3)
    with pytest.raises(InputError, match="must be >= 0"):
        load_experiment(exp, chunk_frames=-1)
    with pytest.raises(InputError, match="dynamic_chunks"):
        load_experiment(make_experiment(tmp_path / "fixed", tiny_model_config())[1], chunk_frames=4)


def make_experiment(work, model_config):
    prepare_librispeech(REAL, ["test-real"], work / "data", show_progress=False)
    utts = read_manifest(work / "data" / "test-real.jsonl")
    tokenizer = train_tokenizer([u.text for u in utts], work / "tokenizer", 40, "char")
    normalizer = GlobalNormalizer.fit(log_mel(read_audio(u.audio_path)).numpy() for u in utts)
    (work / "cmvn.json").write_text(json.dumps(normalizer.to_dict()))
    config = ExperimentConfig(
        model=model_config,
        data=DataConfig(tokenizer=str(work / "tokenizer"), cmvn=str(work / "cmvn.json"),
                        batch_seconds=20.0),
    )  # fmt: skip
    exp = work / "exp"
    exp.mkdir()
    (exp / "config.yaml").write_text(dump_config(adopt_assets(config, exp)))  # as training does
    keras.utils.set_random_seed(3)
    network = build_network(config, tokenizer.vocab_size)
    bias = network.joint.output_layer.bias
    bias.assign(bias.numpy() + np.r_[-3.0, np.zeros(tokenizer.vocab_size - 1)])
    CheckpointManager(exp / "checkpoints").save(network, TrainState(1, 0, 1))
    return work, exp, utts


def test_exported_model_serves_without_asrkit_and_matches_decode(experiment, tmp_path):
    """Both signatures, in a process that cannot import asrkit: the batched one equals N
    single calls, and both equal `asrkit decode` and the training-side timed words; times
    are the emitting frames' less the experiment's calibrated emission delay (never < 0)."""
    import shutil

    work, exp, utts = experiment
    exp = shutil.copytree(exp, tmp_path / "exp")
    delay = 0.06  # more than frame 0's centre (42.5 ms): its tokens are clamped to 0 s
    write_timing(exp, {"emission_delay_seconds": delay})
    out = export_model(exp, tmp_path / "saved")
    assert json.loads((out / "asrkit_export.json").read_text())["sample_rate"] == 16000
    saved = tf.train.list_variables(str(out / "variables" / "variables"))
    values = sum(int(np.prod(shape)) for name, shape in saved if "VARIABLE_VALUE" in name)
    assert values == load_experiment(exp).network.count_params()  # every weight once
    paths = [u.audio_path for u in utts]
    served = subprocess.run(
        [sys.executable, "-c", SERVE_WITHOUT_ASRKIT, str(out), *paths],
        capture_output=True, text=True, timeout=300, cwd=tmp_path,
    )  # fmt: skip
    assert served.returncode == 0, served.stderr[-3000:]
    exported = json.loads(served.stdout.strip().splitlines()[-1])
    single, batch = exported["single"], exported["batch"]

    loaded = load_experiment(exp)
    config, tokenizer = loaded.config, loaded.tokenizer
    report = decode_manifest(Recogniser.of(loaded), work / "data" / "test-real.jsonl", tokenizer,
                             config.data.batch_seconds)  # fmt: skip
    decoded = {u.id: u.hypothesis for u in report.utterances}
    transcribed = transcribe_files(NetworkRecogniser.of(loaded), paths)
    assert loaded.emission_delay == delay
    assert sum(len(one["words"]) for one in single) > 20
    assert any(0 in here.hypothesis.frames for here in transcribed)  # the clamp is used
    for row, (utt, one, here) in enumerate(zip(utts, single, transcribed, strict=True)):
        n, w = one["token_counts"], one["word_counts"]
        assert one["text"] == decoded[utt.id] == here.text
        assert one["tokens"][:n] == here.hypothesis.tokens and len(one["tokens"]) == n
        assert one["words"] == [word.text for word in here.words]
        assert " ".join(one["words"]) == one["text"]
        for key, attribute in [("word_starts", "start"), ("word_ends", "end"),
                               ("word_confidence", "confidence")]:  # fmt: skip
            expected = [getattr(word, attribute) for word in here.words]
            assert one[key] == pytest.approx(expected, abs=1e-5)
        assert one["token_frames"] == here.hypothesis.frames
        assert one["token_times"] == pytest.approx(
            [max(0.0, 0.0425 - delay + 0.04 * f) for f in here.hypothesis.frames], abs=1e-5
        )
        assert one["nbest_texts"] == [one["text"]] and one["nbest_counts"] == 1  # greedy
        # The batched signature: the same per row, padding past each row's count.
        assert batch["text"][row] == one["text"] and batch["score"][row] == pytest.approx(
            one["score"], rel=1e-4
        )
        assert batch["token_counts"][row] == n and batch["tokens"][row][:n] == one["tokens"]
        assert set(batch["tokens"][row][n:]) <= {-1}
        assert batch["words"][row][:w] == one["words"] and set(batch["words"][row][w:]) <= {""}
        assert batch["token_frames"][row][:n] == one["token_frames"]
        for key in ("token_times", "word_starts", "word_ends", "word_confidence"):
            width = n if key == "token_times" else w
            assert batch[key][row][:width] == pytest.approx(one[key], abs=1e-5)


def test_calibrate_refuses_an_untimed_model_and_a_stored_delay_is_subtracted(experiment, tmp_path):
    """`asrkit calibrate` (run from another directory) on this untrained model, whose first
    words land before the speech: one line, exit 2, nothing stored. A stored delay is then
    loaded with the experiment and its words move earlier by exactly that much."""
    import shutil

    from asrkit.decoding.onset import ImplausibleDelay, measure_emission_delay

    work, exp, utts = experiment
    exp = shutil.copytree(exp, tmp_path / "exp")
    paths = [u.audio_path for u in utts]
    plain = load_experiment(exp)
    assert plain.emission_delay == 0.0
    with pytest.raises(ImplausibleDelay, match="before the speech begins"):
        measure_emission_delay(NetworkRecogniser.of(plain), paths)
    asrkit = Path(sys.executable).parent / "asrkit"
    run = subprocess.run(
        [str(asrkit), "calibrate", "--exp-dir", str(exp), "--manifest",
         str(work / "data" / "test-real.jsonl")],
        capture_output=True, text=True, timeout=300, cwd=tmp_path,
    )  # fmt: skip
    assert run.returncode == 2 and len(run.stderr.strip().splitlines()) == 1, run.stderr
    assert "before the speech begins" in run.stderr and not (exp / "timing.json").exists()
    write_timing(exp, {"emission_delay_seconds": 0.08})
    calibrated = load_experiment(exp)
    assert calibrated.emission_delay == 0.08
    before = transcribe_files(NetworkRecogniser.of(plain), paths)
    after = transcribe_files(NetworkRecogniser.of(calibrated), paths)
    for one, two in zip(before, after, strict=True):
        assert [w.text for w in one.words] == [w.text for w in two.words]
        want = [max(0.0, w.start - calibrated.emission_delay) for w in one.words]
        assert [w.start for w in two.words] == pytest.approx(want, abs=1e-5)


@pytest.mark.slow  # ~48 s of subprocesses: with the slow tests (make test measured 360-392 s)
def test_transcribe_cli_with_an_export_and_an_experiment(experiment, tmp_path, capsys):
    """text, JSON lines and SRT agree between an export and its experiment, from another
    directory; a long file (three clips) is decoded in windows; mistakes exit 2."""
    import shutil

    import soundfile

    from asrkit.experiment import TrainingLengths, write_training_lengths

    _, source, utts = experiment
    exp = tmp_path / "exp"
    shutil.copytree(source, exp)
    # trained on up to 10 s: windows of segments up to 8 s with 1 s of context each side,
    # the export's and the experiment's alike
    write_training_lengths(exp, TrainingLengths(10.0, source="a test"))
    out = export_model(exp, tmp_path / "saved")
    asrkit = Path(sys.executable).parent / "asrkit"
    clips = [read_audio(u.audio_path) for u in utts[:3]]
    long_file = tmp_path / "three.wav"
    soundfile.write(long_file, np.concatenate(clips), 16000)
    paths = [utts[1].audio_path, utts[0].audio_path, str(long_file)]
    outputs = {}
    for fmt in ("text", "json"):
        for source in (["--model", str(out)], ["--exp-dir", str(exp)]):
            run = subprocess.run(
                [asrkit, "transcribe", *paths, *source, "--format", fmt],
                capture_output=True, text=True, timeout=300, cwd=tmp_path,
            )  # fmt: skip
            assert run.returncode == 0, run.stderr[-2000:]
            outputs[fmt, source[0]] = run.stdout.strip().splitlines()
    assert [line.split("\t")[0] for line in outputs["text", "--model"]] == paths
    assert outputs["text", "--model"] == outputs["text", "--exp-dir"]
    model_json = [json.loads(line) for line in outputs["json", "--model"]]
    exp_json = [json.loads(line) for line in outputs["json", "--exp-dir"]]
    assert [r["windows"] for r in model_json] == [1, 1, 3]  # cut at both junctions
    for a, b in zip(model_json, exp_json, strict=True):
        assert a["text"] == b["text"] == " ".join(w["word"] for w in a["words"])
        assert [w["word"] for w in a["words"]] == [w["word"] for w in b["words"]]
        for wa, wb in zip(a["words"], b["words"], strict=True):
            assert wa["start"] == pytest.approx(wb["start"], abs=1e-3)
            assert 0 < wa["confidence"] <= 1 and wa["end"] >= wa["start"]
        starts = [w["start"] for w in a["words"]]
        assert starts == sorted(starts) and starts[-1] < a["duration"]
        ends = [w["end"] for w in a["words"]]
        assert all(e <= s for e, s in zip(ends[:-1], starts[1:], strict=True)) or a["windows"] > 1

    srt = subprocess.run(
        [asrkit, "transcribe", paths[0], "--model", str(out), "--format", "srt"],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert srt.returncode == 0, srt.stderr[-2000:]
    cues = srt.stdout.strip().split("\n\n")
    assert [c.splitlines()[0] for c in cues] == [str(i + 1) for i in range(len(cues))]
    assert " ".join(c.splitlines()[2] for c in cues) == model_json[0]["text"]
    assert re.fullmatch(r"\d\d:\d\d:\d\d,\d{3} --> \d\d:\d\d:\d\d,\d{3}", cues[0].splitlines()[1])

    written = subprocess.run(
        [asrkit, "transcribe", *paths[:2], "--model", str(out), "--format", "srt",
         "--out-dir", str(tmp_path / "subs")],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert written.returncode == 0, written.stderr[-2000:]
    subs = sorted((tmp_path / "subs").glob("*.srt"))
    assert [p.stem for p in subs] == sorted(Path(p).stem for p in paths[:2])
    assert subs[0].read_text().startswith("1\n")

    for wrong, says in [
        (["--format", "srt", *paths], "--out-dir"),
        (["--out-dir", str(tmp_path / "o"), paths[0], paths[0]], "rename one"),
        (["--nbest", "-1", paths[0]], "--nbest"),
        (["--max-seconds", "0", paths[0]], "--max-seconds"),
        ([str(tmp_path / "missing.flac")], "missing.flac"),
    ]:
        # In process: the exit-2, one-line contract as a command is tests/cli's.
        assert main(["transcribe", "--model", str(out), *wrong]) == 2, wrong
        err = capsys.readouterr().err
        assert says in err and len(err.strip().splitlines()) == 1, (wrong, err)

    # One unreadable file among several: the others are transcribed and written, the bad
    # one named, exit 2.
    broken = tmp_path / "broken.flac"
    broken.write_bytes(b"not audio at all")
    for source in (["--model", str(out)], ["--exp-dir", str(exp)]):
        done = tmp_path / f"done{len(source[0])}"
        argv = ["transcribe", *source, paths[0], str(broken), paths[1], "--out-dir", str(done)]
        assert main(argv) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert any("broken.flac: cannot read audio" in line for line in err), err
        assert "1 of 3 file(s) could not be read" in err[-1]
        assert sorted(p.stem for p in done.iterdir()) == sorted(Path(p).stem for p in paths[:2])


def test_exported_beam_search_matches_beam_decoding(experiment, tmp_path):
    import tensorflow as tf

    from asrkit.decoding.search.front import DecodeOptions

    _, exp, utts = experiment
    options = DecodeOptions("beam", beam=4, max_symbols_per_step=2)
    out = export_model(exp, tmp_path / "beam", options=options)
    assert "beam 4" in json.loads((out / "asrkit_export.json").read_text())["decoding"]
    serve = tf.saved_model.load(str(out)).signatures["serving_default"]
    loaded = load_experiment(exp)
    paths = [u.audio_path for u in utts[:3]]
    found = transcribe_files(NetworkRecogniser.of(loaded, options), paths)
    expected = _by_path(found)
    expected_nbest = {t.path: t.nbest for t in found}
    greedy = _by_path(transcribe_files(NetworkRecogniser.of(loaded), paths))
    assert any(expected[p].tokens != greedy[p].tokens for p in paths)  # beam is not greedy here
    for path in paths:
        result = serve(waveform=tf.constant(read_audio(path)))
        assert result["tokens"].numpy().tolist() == expected[path].tokens
        assert result["text"].numpy().decode() == expected[path].text
        assert float(result["score"]) == pytest.approx(expected[path].score, rel=1e-4)
        nbest = expected_nbest[path]
        assert int(result["nbest_counts"]) == len(nbest) > 1
        texts = [t.decode() for t in result["nbest_texts"].numpy()]
        # The same hypotheses and scores (their order may differ where scores tie to 1e-4).
        scores = result["nbest_scores"].numpy()[: len(nbest)]
        exported = dict(zip(texts[: len(nbest)], scores.tolist(), strict=True))
        assert sorted(exported) == sorted(h.text for h in nbest)
        for h in nbest:
            assert exported[h.text] == pytest.approx(h.score, rel=1e-5)
        assert sorted(result["nbest_scores"].numpy()[: len(nbest)], reverse=True) == list(
            result["nbest_scores"].numpy()[: len(nbest)]
        )
    # Shorter than one encoder frame: no tokens, one (empty) hypothesis; a single call's
    # outputs end at their counts (no -1 or '' padding).
    tiny = serve(waveform=tf.constant(np.zeros(400, np.float32)))
    assert int(tiny["token_counts"]) == 0 and tiny["tokens"].numpy().tolist() == []
    assert tiny["token_times"].numpy().tolist() == [] and tiny["text"].numpy() == b""
    assert int(tiny["nbest_counts"]) == 1 and tiny["nbest_texts"].numpy().tolist() == [b""]


def _by_path(transcripts):
    return {t.path: t.hypothesis for t in transcripts}


@pytest.mark.slow
def test_streaming_transcription_equals_whole_file_greedy(experiment, tmp_path, capsys):
    """`asrkit transcribe --streaming` (0.13 s pieces, from another directory): the same
    JSON as greedy search on each whole file, the text so far on stderr as it grows; with
    --method beam, the same n-best as beam search on each whole file."""
    import soundfile

    _, exp, utts = experiment
    asrkit = Path(sys.executable).parent / "asrkit"
    long_file = tmp_path / "three.wav"
    soundfile.write(long_file, np.concatenate([read_audio(u.audio_path) for u in utts[:3]]),
                    16000)  # fmt: skip
    paths = [utts[1].audio_path, str(long_file)]
    runs = {}
    beam = ["--method", "beam", "--beam", "4", "--nbest", "4"]
    for name, extra in {
        "--streaming": ["--streaming", "--chunk-seconds", "0.13"],
        "--max-seconds": ["--max-seconds", "1000"],
        "streaming beam": ["--streaming", "--chunk-seconds", "0.21", *beam],
        "beam": ["--max-seconds", "1000", *beam],
    }.items():
        run = subprocess.run(
            [asrkit, "transcribe", *paths, "--exp-dir", str(exp), "--format", "json", *extra],
            capture_output=True, text=True, timeout=300, cwd=tmp_path,
        )  # fmt: skip
        assert run.returncode == 0, run.stderr[-2000:]
        runs[name] = run
    streamed_beam = [json.loads(line) for line in runs["streaming beam"].stdout.splitlines()]
    whole_beam = [json.loads(line) for line in runs["beam"].stdout.splitlines()]
    for s, w in zip(streamed_beam, whole_beam, strict=True):
        assert s["text"] == w["text"] == s["nbest"][0]["text"]
        assert [h["score"] for h in s["nbest"]] == pytest.approx(
            [h["score"] for h in w["nbest"]], abs=1e-3
        )
        # Below the best, this barely trained model holds hypotheses tied to float noise: the
        # chunked encoder's last ulps can keep one at the beam's edge and prune another of the
        # same score. Ranks agree in score; a hypothesis in both lists has the same score.
        whole_scores = {h["text"]: h["score"] for h in w["nbest"]}
        common = [h for h in s["nbest"] if h["text"] in whole_scores]
        assert [h["score"] for h in common] == pytest.approx(
            [whole_scores[h["text"]] for h in common], abs=1e-3
        )
    streamed = [json.loads(line) for line in runs["--streaming"].stdout.splitlines()]
    whole = [json.loads(line) for line in runs["--max-seconds"].stdout.splitlines()]
    assert [s["text"] for s in streamed] == [w["text"] for w in whole]
    for s, w in zip(streamed, whole, strict=True):
        assert [x["word"] for x in s["words"]] == [x["word"] for x in w["words"]]
        for key in ("start", "end", "confidence"):
            assert [x[key] for x in s["words"]] == pytest.approx([x[key] for x in w["words"]],
                                                                 abs=1e-3)  # fmt: skip
    partial = re.findall(r"^(.*) \[\s*([\d.]+) s\] (.*)$", runs["--streaming"].stderr, re.M)
    for path, result in zip(paths, streamed, strict=True):
        lines = [(float(at), text) for p, at, text in partial if p == path]
        if result["text"]:
            assert lines[-1][1] == result["text"]
            assert [at for at, _ in lines] == sorted(at for at, _ in lines)
    for wrong, says in [
        (["--streaming", "--chunk-seconds", "0"], "--chunk-seconds"),
        (["--chunk-frames", "4"], "model.encoder.dynamic_chunks"),
        (["--realtime"], "--streaming"),
    ]:
        assert main(["transcribe", paths[0], "--exp-dir", str(exp), *wrong]) == 2, wrong
        err = capsys.readouterr().err
        assert says in err and len(err.strip().splitlines()) == 1, (wrong, err)


STREAM_WITHOUT_ASRKIT = (
    WITHOUT_ASRKIT
    + r"""
step = loaded.signatures["stream_step"]
results = []
for path in sys.argv[2:]:
    samples, rate = soundfile.read(path, dtype="float32")
    state = loaded.signatures["initial_state"]()
    tokens, times, texts = [], [], []
    for start in range(0, len(samples), 2080):  # 0.13 s pieces
        out = step(samples=tf.constant(samples[start : start + 2080]), **state)
        state = {k: v for k, v in out.items() if k.startswith("state_")}
        tokens += out["tokens"].numpy().tolist()
        times += out["token_times"].numpy().tolist()
        texts.append(out["text"].numpy().decode())
    out = loaded.signatures["stream_finish"](**state)
    tokens += out["tokens"].numpy().tolist()
    times += out["token_times"].numpy().tolist()
    texts.append(out["text"].numpy().decode())
    results.append({"tokens": tokens, "times": times, "texts": texts})
print(json.dumps(results))
"""
)


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["experiment", "chunked_experiment"])
def test_streaming_export_serves_pieces_without_asrkit(kind, request, tmp_path):
    """`asrkit export --streaming`: a process that cannot import asrkit feeds real clips in
    0.13 s pieces and ends with the tokens, times and text of greedy search on each whole
    clip; the text so far only grows. LSTM encoder and chunked Conformer."""
    _, exp, utts = request.getfixturevalue(kind)
    asrkit = Path(sys.executable).parent / "asrkit"
    out = tmp_path / "streaming"
    made = subprocess.run([asrkit, "export", "--exp-dir", str(exp), "--out", str(out),
                           "--streaming", "--litert"], capture_output=True, text=True,
                          timeout=300)  # fmt: skip
    assert made.returncode == 0, made.stderr[-2000:]
    info = json.loads((out / "asrkit_export.json").read_text())
    signatures = {"initial_state", "stream_step", "stream_tokens", "stream_finish"}
    assert info["streaming"] and set(info["signatures"]) == {*signatures, "finish_tokens"}
    paths = [u.audio_path for u in utts[:3]]
    run = subprocess.run([sys.executable, "-c", STREAM_WITHOUT_ASRKIT, str(out), *paths],
                         capture_output=True, text=True, timeout=300)  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    streamed = json.loads(run.stdout.strip().splitlines()[-1])
    experiment_ = load_experiment(exp)
    recogniser = NetworkRecogniser.of(experiment_)
    whole = transcribe_files(recogniser, paths)
    for got, want in zip(streamed, whole, strict=True):
        assert got["tokens"] == want.hypothesis.tokens
        clock = recogniser.clock
        want_times = [clock.offset + f * clock.period for f in want.hypothesis.frames]
        assert got["times"] == pytest.approx(want_times, abs=1e-4)
        assert got["texts"][-1] == want.text
        assert all(b.startswith(a.rstrip()) for a, b in itertools.pairwise(got["texts"]))
    for flags, says in [
        (["--streaming", "--method", "beam"], "greedy"),
        (["--litert"], "--streaming"),
    ]:
        wrong = subprocess.run([asrkit, "export", "--exp-dir", str(exp), "--out",
                                str(tmp_path / "x"), *flags], capture_output=True, text=True,
                               timeout=300)  # fmt: skip
        assert wrong.returncode == 2 and says in wrong.stderr and "Traceback" not in wrong.stderr
    litert = run_litert(out / "stream_tokens.tflite", paths)
    assert [r["tokens"] for r in litert] == [r["tokens"] for r in streamed]
    for a, b in zip(litert, streamed, strict=True):
        assert a["times"] == pytest.approx(b["times"], abs=1e-4)


@pytest.mark.slow
def test_a_streaming_export_with_boosting_and_an_lm_built_in(experiment, tmp_path):
    """`asrkit export --streaming --litert --boost --lm`: the SavedModel (fed without asrkit)
    and its LiteRT model end each clip with the tokens of the network's greedy search with
    the same tables on the whole clip, which differ from the plain search's; the export
    says what it has built in. Without --streaming the options are refused in one line."""
    from asrkit.decoding.fusion.boosting import load_boost
    from asrkit.decoding.fusion.lm import lm_automaton
    from asrkit.decoding.fusion.tables import combine
    from asrkit.ngram import estimate, read_arpa, write_arpa

    _, exp, utts = experiment
    loaded = load_experiment(exp)
    tokenizer, vocab = loaded.tokenizer, loaded.network.vocab_size
    pieces = [tokenizer.piece(i) for i in range(vocab)]
    text = [[pieces[i] for i in tokenizer.encode("the tarot nest stone")]] * 3
    arpa = write_arpa(estimate(text, 3, pieces[1:]), tmp_path / "lm.arpa")
    phrases = tmp_path / "phrases.txt"
    phrases.write_text("tarot\nstone\n")
    asrkit = Path(sys.executable).parent / "asrkit"
    out = tmp_path / "streaming"
    fusion = ["--boost", str(phrases), "--boost-weight", "3", "--lm", str(arpa),
              "--lm-weight", "0.5"]  # fmt: skip
    made = subprocess.run([asrkit, "export", "--exp-dir", str(exp), "--out", str(out),
                           "--streaming", "--litert", *fusion], capture_output=True,
                          text=True, timeout=300)  # fmt: skip
    assert made.returncode == 0, made.stderr[-2000:]
    info = json.loads((out / "asrkit_export.json").read_text())
    assert "boosting phrases.txt (weight 3), LM lm.arpa (weight 0.5)" in info["decoding"]
    tables = combine(load_boost(phrases, tokenizer, vocab, 3.0),
                     lm_automaton(read_arpa(arpa), pieces, 0.5))  # fmt: skip
    paths = [u.audio_path for u in utts[:3]]
    whole = [t.hypothesis.tokens for t in
             transcribe_files(NetworkRecogniser.of(loaded, boost=tables), paths)]  # fmt: skip
    plain = [t.hypothesis.tokens for t in transcribe_files(NetworkRecogniser.of(loaded), paths)]
    assert whole != plain
    run = subprocess.run([sys.executable, "-c", STREAM_WITHOUT_ASRKIT, str(out), *paths],
                         capture_output=True, text=True, timeout=300)  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    assert [r["tokens"] for r in json.loads(run.stdout.strip().splitlines()[-1])] == whole
    assert [r["tokens"] for r in run_litert(out / "stream_tokens.tflite", paths)] == whole
    wrong = subprocess.run([asrkit, "export", "--exp-dir", str(exp), "--out",
                            str(tmp_path / "x"), *fusion], capture_output=True, text=True,
                           timeout=300)  # fmt: skip
    assert wrong.returncode == 2 and "built into a streaming export" in wrong.stderr
    assert "Traceback" not in wrong.stderr and not (tmp_path / "x").exists()


def run_litert(model_path, paths):
    """The LiteRT model of the streaming step, fed the same 0.13 s pieces from the initial
    state saved beside it, by the code docs/export.md shows users."""
    import warnings

    doc = (Path(__file__).resolve().parents[1] / "docs/export.md").read_text()
    code = doc.split("```python\n", 1)[1].split("```", 1)[0]
    namespace = {}
    exec(compile(code, "docs/export.md", "exec"), namespace)
    results = []
    for path in paths:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # tf.lite.Interpreter's deprecation notice
            tokens, times = namespace["stream_with_litert"](model_path, read_audio(path))
        results.append({"tokens": tokens, "times": times})
    return results


def test_an_export_over_an_existing_one_needs_force_and_replaces_it_whole(
    experiment, tmp_path, capsys
):
    """`asrkit export --out` onto an earlier export: refused in one line (the old export
    untouched) unless --force, which writes the new one beside it and swaps it in, leaving
    no temporary directory; `--nbest` beyond an export's beam is refused before loading."""
    from asrkit.cli.main import main

    _, exp, utts = experiment
    out = tmp_path / "saved"
    assert main(["export", "--exp-dir", str(exp), "--out", str(out)]) == 0
    before = (out / "asrkit_export.json").read_text()
    assert "greedy search" in before
    capsys.readouterr()
    again = ["export", "--exp-dir", str(exp), "--out", str(out), "--method", "beam"]
    assert main(again) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "exists and is not empty" in err[0] and "--force" in err[0]
    assert (out / "asrkit_export.json").read_text() == before
    assert main([*again, "--beam", "3", "--force"]) == 0
    assert "beam search, beam 3" in (out / "asrkit_export.json").read_text()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["saved"]
    capsys.readouterr()
    nbest = ["transcribe", "--model", str(out), "--nbest", "5", "--format", "json",
             utts[0].audio_path]  # fmt: skip
    assert main(nbest) == 2
    assert "exported with beam search, which finds at most 3" in capsys.readouterr().err


def test_windows_fit_the_recorded_training_length_and_a_longer_one_warns(
    experiment, tmp_path, capsys
):
    """An experiment trained on utterances of up to 3 s: transcribe's default windows
    (segment and contexts) stay within 3 s, with an export too (it carries the length);
    a longer window asked for is used, with one warning line (an export, which cuts its
    own windows, refuses it naming them)."""
    import shutil

    import soundfile

    from asrkit.cli.main import main
    from asrkit.experiment import TrainingLengths, write_training_lengths

    _, source, utts = experiment
    exp = tmp_path / "exp"
    shutil.copytree(source, exp)
    write_training_lengths(exp, TrainingLengths(3.0, source="a test"))
    clips = [read_audio(u.audio_path) for u in utts[:3]]
    long_file = tmp_path / "three.wav"
    soundfile.write(long_file, np.concatenate(clips), 16000)
    seconds = sum(len(c) for c in clips) / 16000
    assert main(["export", "--exp-dir", str(exp), "--out", str(tmp_path / "saved")]) == 0
    info = json.loads((tmp_path / "saved" / "asrkit_export.json").read_text())
    assert info["training_max_seconds"] == 3.0
    for source_args in (["--exp-dir", str(exp)], ["--model", str(tmp_path / "saved")]):
        capsys.readouterr()
        assert main(["transcribe", str(long_file), *source_args, "--format", "json"]) == 0
        result = json.loads(capsys.readouterr().out)
        assert result["windows"] >= seconds / 3.0  # segments of at most 2.4 s
        capsys.readouterr()
        longer = ["transcribe", str(long_file), *source_args, "--format", "json",
                  "--max-seconds", "8"]  # fmt: skip
        if source_args[0] == "--model":  # the export's windows are its own: named, refused
            assert main(longer) == 2
            err = capsys.readouterr().err
            assert "--max-seconds 8:" in err and "segments of up to 2.4 s" in err
            continue
        with pytest.warns(UserWarning, match=r"longer than anything.*trained on \(3\.0 s\)"):
            assert main(longer) == 0
        assert json.loads(capsys.readouterr().out)["windows"] < result["windows"]


def test_the_export_decodes_a_long_waveform_in_windows_as_transcribe_does(experiment, tmp_path):
    """A model trained on utterances of up to 3 s, exported: serving_default cuts a longer
    waveform at the same quiet points as the NumPy oracle and joins the same words (text,
    word times, tokens), one window in memory at a time; `asrkit transcribe` alike."""
    import shutil

    from asrkit.decoding.long_audio import Windowing, windowing_for
    from asrkit.decoding.transcribe import NetworkRecogniser, transcribe_files
    from asrkit.experiment import TrainingLengths, write_training_lengths
    from tests.decoding.window_oracle import transcribe_in_windows

    _, source, utts = experiment
    exp = tmp_path / "exp"
    shutil.copytree(source, exp)
    write_training_lengths(exp, TrainingLengths(3.0, source="a test"))
    import soundfile

    audio = np.concatenate([read_audio(u.audio_path) for u in utts[:4]])
    long_file = tmp_path / "four.wav"
    soundfile.write(long_file, audio, 16000)
    out = export_model(exp, tmp_path / "saved")
    info = json.loads((out / "asrkit_export.json").read_text())
    assert info["window_seconds"] == pytest.approx(2.4)
    assert info["window_context_seconds"] == pytest.approx(0.3)
    got = tf.saved_model.load(str(out)).signatures["serving_default"](waveform=tf.constant(audio))
    windowing, _ = windowing_for(3.0)
    # the oracle: the windows planned in NumPy, each decoded whole, joined in Python
    whole = NetworkRecogniser.of(load_experiment(exp), windowing=Windowing(max_seconds=1e6))
    want = transcribe_in_windows(whole, audio, windowing)
    [here] = transcribe_files(NetworkRecogniser.of(load_experiment(exp), windowing=windowing),
                              [long_file])  # fmt: skip
    assert here.text == want.text and here.hypothesis.tokens == want.hypothesis.tokens
    assert want.windows >= 4 and len(want.words) > 10
    assert got["text"].numpy().decode() == want.text
    assert [w.decode() for w in got["words"].numpy()] == [w.text for w in want.words]
    np.testing.assert_allclose(got["word_starts"].numpy(), [w.start for w in want.words],
                               atol=1e-4)  # fmt: skip
    assert got["tokens"].numpy().tolist() == want.hypothesis.tokens
    assert float(got["score"]) == pytest.approx(want.hypothesis.score, rel=1e-4)
    assert int(got["nbest_counts"]) == 1
    # serve_batch with the long waveform in it: each row as serving_default gives it alone,
    # padded as a batch pads (a short row keeps its whole-utterance decoding)
    loaded = tf.saved_model.load(str(out))
    short = read_audio(utts[4].audio_path)
    padded = np.zeros([2, len(audio)], np.float32)
    padded[0], padded[1, : len(short)] = audio, short
    lengths = tf.constant([len(audio), len(short)])
    batch = loaded.signatures["serve_batch"](waveforms=tf.constant(padded), lengths=lengths)
    assert set(batch) == set(got) == set(OUTPUTS)
    for row, wave in enumerate((audio, short)):
        alone = loaded.signatures["serving_default"](waveform=tf.constant(wave))
        for key, value in alone.items():
            value, row_value = np.asarray(value.numpy()), batch[key].numpy()[row]
            if value.ndim:  # a row holds the single call's values, then the padding
                assert np.array_equal(row_value[: len(value)], value), key
                fill = PADDING[key]
                fill = fill.encode() if isinstance(fill, str) else fill
                assert np.all(row_value[len(value) :] == fill), key
            else:
                assert row_value == value, key


@pytest.mark.parametrize("method", ["greedy", pytest.param("beam", marks=pytest.mark.slow)])
def test_the_export_boosts_the_phrases_it_is_given_as_decoding_does(experiment, tmp_path, method):
    """`serve_batch_boosted` with a phrase list's and an LM's tables gives the network
    search's texts with them (`asrkit transcribe --model --boost` = `--exp-dir --boost`);
    tables of no phrase give `serve_batch`'s. The phrases are compiled with the tokenizer
    the export carries."""
    from asrkit.cli.main import main
    from asrkit.decoding.fusion.boosting import load_boost, no_boost
    from asrkit.decoding.fusion.lm import lm_automaton
    from asrkit.decoding.fusion.tables import combine
    from asrkit.decoding.search.front import DecodeOptions
    from asrkit.decoding.transcribe import SavedModelRecogniser
    from asrkit.ngram import estimate, write_arpa

    _, exp, utts = experiment
    options = DecodeOptions(method, beam=3)
    out = export_model(exp, tmp_path / "saved", options=options)
    loaded = load_experiment(exp)
    paths = [u.audio_path for u in utts]
    plain = [t.text for t in transcribe_files(NetworkRecogniser.of(loaded, options), paths)]
    phrases = tmp_path / "phrases.txt"
    phrases.write_text("tarot\nnest\nstone\n")
    tokenizer, vocab = loaded.tokenizer, loaded.network.vocab_size
    pieces = [tokenizer.piece(i) for i in range(vocab)]
    lm = estimate([[pieces[i] for i in tokenizer.encode("the tarot nest stone")]], 2, pieces[1:])
    tables = combine(load_boost(phrases, tokenizer, vocab, 3.0), lm_automaton(lm, pieces, 0.5))
    want = [t.text for t in transcribe_files(
        NetworkRecogniser.of(loaded, options, boost=tables), paths)]  # fmt: skip
    assert want != plain
    served = [t.text for t in transcribe_files(SavedModelRecogniser(out, tables), paths)]
    assert served == want
    none = combine(no_boost(loaded.network.vocab_size))
    assert [t.text for t in transcribe_files(SavedModelRecogniser(out, none), paths)] == plain
    listed = tmp_path / "cli"
    arpa = write_arpa(lm, tmp_path / "lm.arpa")
    assert main(["transcribe", "--model", str(out), "--boost", str(phrases), "--boost-weight",
                 "3", "--lm", str(arpa), "--lm-weight", "0.5", "--out-dir", str(listed),
                 *paths]) == 0  # fmt: skip
    assert [(listed / f"{Path(p).stem}.txt").read_text().split("\t")[-1].strip()
            for p in paths] == want  # fmt: skip


def test_transcribe_with_an_export_uses_what_it_records_and_refuses_what_it_cannot(
    experiment, tmp_path, capsys
):
    """An export records the search, weights, chunk and fusion weights it came with;
    `transcribe --model EXPORT --lm` fuses at the experiment's decode.lm_weight (as
    `--exp-dir` does), and an option the export cannot honour (another method or beam,
    other weights or chunks, a streaming export) is refused in one line naming it."""
    import dataclasses
    import shutil

    from asrkit.config import DecodeConfig
    from asrkit.decoding.search.front import DecodeOptions
    from asrkit.experiment import load_experiment_config
    from asrkit.ngram import estimate, write_arpa

    _, source, utts = experiment
    exp = tmp_path / "exp"
    shutil.copytree(source, exp)
    config = load_experiment_config(exp)
    decode = DecodeConfig(max_symbols_per_step=config.decode.max_symbols_per_step,
                          boost_weight=2.5, lm_weight=0.5, lodr_weight=0.3)  # fmt: skip
    (exp / "config.yaml").write_text(dump_config(dataclasses.replace(config, decode=decode)))
    out = export_model(exp, tmp_path / "saved", options=DecodeOptions("beam", beam=3))
    info = json.loads((out / "asrkit_export.json").read_text())
    assert info["fusion_weights"] == {"boost_weight": 2.5, "lm_weight": 0.5, "lodr_weight": 0.3}
    assert info["search"]["method"] == "beam" and info["search"]["beam"] == 3
    assert info["weights"] and info["chunk_frames"] is None and info["nemo_ids"] is False

    loaded = load_experiment(exp)
    tokenizer, vocab = loaded.tokenizer, loaded.network.vocab_size
    pieces = [tokenizer.piece(i) for i in range(vocab)]
    lm = estimate([[pieces[i] for i in tokenizer.encode("the tarot nest stone")]], 2, pieces[1:])
    arpa = write_arpa(lm, tmp_path / "lm.arpa")
    paths = [u.audio_path for u in utts]
    texts = {}
    for name, source_args in (("model", ["--model", str(out)]),
                              ("exp", ["--exp-dir", str(exp), "--method", "beam", "--beam", "3"]),
                              ("default", ["--exp-dir", str(exp), "--method", "beam", "--beam",
                                           "3", "--lm-weight", "0.2"]),
                              ):  # fmt: skip
        assert main(["transcribe", *source_args, "--lm", str(arpa), *paths]) == 0
        texts[name] = capsys.readouterr().out
    assert texts["model"] == texts["exp"] != texts["default"]

    streaming = tmp_path / "streaming"
    streaming.mkdir()
    (streaming / "asrkit_export.json").write_text(json.dumps({"streaming": True}))
    for model, wrong, says in [
        (out, ["--method", "greedy"], "runs beam search, beam 3"),
        (out, ["--beam", "8"], "runs beam search, beam 3"),
        (out, ["--average", "2"], "--average: "),
        (out, ["--checkpoint", str(exp / "checkpoints")], "--checkpoint: "),
        (streaming, [], "is a streaming export"),
    ]:
        assert main(["transcribe", "--model", str(model), *wrong, paths[0]]) == 2, wrong
        err = capsys.readouterr().err
        assert says in err and len(err.strip().splitlines()) == 1, (wrong, err)
    assert main(["transcribe", "--model", str(out), "--method", "beam", "--beam", "3",
                 paths[0]]) == 0  # fmt: skip


def test_decode_reads_its_config_and_its_phrase_list_once(experiment, tmp_path, monkeypatch):
    """On the way from the command into the package, `asrkit decode --boost --lm` reads the
    experiment's config once and the phrase list and LM once (checked before the model
    loads, then built into the tables from what was read)."""
    import asrkit.decoding.fusion.boosting as boosting
    import asrkit.experiment as experiment_module
    import asrkit.ngram as ngram
    from asrkit.ngram import estimate, write_arpa

    work, exp, _ = experiment
    phrases = tmp_path / "phrases.txt"
    phrases.write_text("tarot\nnest\n")
    loaded = load_experiment(exp)
    tokenizer, vocab = loaded.tokenizer, loaded.network.vocab_size
    pieces = [tokenizer.piece(i) for i in range(vocab)]
    lm = estimate([[pieces[i] for i in tokenizer.encode("the tarot nest")]], 2, pieces[1:])
    arpa = write_arpa(lm, tmp_path / "lm.arpa")
    calls = {"config": 0, "phrases": 0, "lm": 0}

    def counted(key, function):
        def wrapper(*args, **kwargs):
            calls[key] += 1
            return function(*args, **kwargs)

        return wrapper

    monkeypatch.setattr(experiment_module, "load_experiment_config",
                        counted("config", experiment_module.load_experiment_config))  # fmt: skip
    monkeypatch.setattr(boosting, "read_phrases", counted("phrases", boosting.read_phrases))
    monkeypatch.setattr(ngram, "read_arpa", counted("lm", ngram.read_arpa))
    argv = ["decode", "--exp-dir", str(exp), "--manifest", str(work / "data/test-real.jsonl"),
            "--boost", str(phrases), "--lm", str(arpa), "--out", str(tmp_path / "out")]  # fmt: skip
    assert main(argv) == 0
    assert calls == {"config": 1, "phrases": 1, "lm": 1}
