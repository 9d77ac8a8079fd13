"""The recipes, every stage, on tiny synthetic corpora with tiny models (CI smoke tests)."""

import json
import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import numpy as np
import pytest

from asrkit.config import SCHEMA_VERSION

ROOT = Path(__file__).resolve().parents[1]
TINY_MODEL = [  # the demo's Conformer, shrunk
    "model.encoder.d_model=16", "model.encoder.num_blocks=1", "model.encoder.num_heads=2",
    "model.encoder.kernel_size=3", "model.encoder.subsampling_filters=8",
    "model.predictor.units=16", "model.predictor.embed_dim=8", "model.joint_dim=16",
    "train.epochs=2", "data.batch_seconds=10", "train.checkpoint_every=1",
]  # fmt: skip


@pytest.mark.slow
def test_mini_recipe_runs_every_stage_and_reruns_nothing(tmp_path):
    asrkit = Path(sys.executable).parent / "asrkit"
    env = dict(os.environ, ASRKIT=str(asrkit), ASRKIT_NO_APT="1")
    cmd = ["bash", str(ROOT / "recipes/mini/run.sh"), "--work", str(tmp_path / "w"),
           "--preset", "tiny"]  # fmt: skip
    for item in TINY_MODEL:
        cmd += ["--set", item]
    first = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert first.returncode == 0, first.stdout[-2000:] + first.stderr[-3000:]
    work = tmp_path / "w"
    for n in range(7):
        assert (work / ".done" / str(n)).exists()
    assert "WER" in (work / "exp/decode_test/report.txt").read_text()
    assert first.stdout.count("    REF: ") == first.stdout.count("    HYP: ") >= 1
    assert (work / "exp/curves.png").read_bytes()[:4] == b"\x89PNG"
    for name in ("decode_test", "decode_test_greedy"):
        scores = json.loads((work / "exp" / name / "wer.json").read_text())
        hypotheses = (work / "exp" / name / "hyp.txt").read_text().splitlines()
        assert scores["utterances"] == len(hypotheses)
    scores = json.loads((work / "exp/decode_test/wer.json").read_text())
    assert (scores["method"], scores["normalizer"]) == ("beam 4", "basic")
    calibrated = (work / "exp/timing.json").is_file()
    assert ("emission delay" in first.stdout) == calibrated
    assert calibrated or "word times stay uncalibrated" in first.stdout
    again = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)
    assert again.returncode == 0
    assert again.stdout.count("done before, skipped") == 7


@pytest.mark.slow
@pytest.mark.skipif(not Path("/usr/share/wordnet/data.noun").is_file(),
                    reason="Debian's wordnet-base is not installed")  # fmt: skip
def test_open_recipe_runs_every_stage_and_reports_oov_words(tmp_path):
    """The open recipe on its tiny preset: every stage, the OOV report of every decode (its
    counts those of the test transcripts against the training ones; the fusion decodes
    with the config's weights and the recipe's LMs and names), an export; a rerun skips
    all."""
    from asrkit.data.open_text import oov_share

    asrkit = Path(sys.executable).parent / "asrkit"
    env = dict(os.environ, ASRKIT=str(asrkit), ASRKIT_NO_APT="1")
    work = tmp_path / "w"
    cmd = ["bash", str(ROOT / "recipes/open/run.sh"), "--work", str(work), "--preset",
           "open-tiny"]  # fmt: skip
    for item in TINY_MODEL:
        cmd += ["--set", item]
    first = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
    assert first.returncode == 0, first.stdout[-2000:] + first.stderr[-3000:]
    assert all((work / ".done" / str(n)).exists() for n in range(8))

    def texts(part):
        return [line.split(" ", 1)[1] for f in (work / "corpus" / part).rglob("*.trans.txt")
                for line in f.read_text().splitlines()]  # fmt: skip

    test, train = texts("test-clean"), texts("train-clean-100")
    names = set((work / "corpus/names.txt").read_text().split())
    named = sum(bool(set(t.split()) & names) for t in test)
    for method in ("greedy", "beam", "beam_lm", "beam_boost", "beam_lm_boost"):
        report = json.loads((work / f"exp/decode_test_{method}/oov.json").read_text())
        assert report["utterances"] == len(test)
        assert report["oov share of words"] == round(100 * oov_share(test, train), 2)
        found, total = map(int, report["oov words recognised"].split("/"))
        assert 0 <= found <= total and total > 0
        assert ("wer with names" in report) == (named > 0) and "wer without names" in report
        scores = json.loads((work / f"exp/decode_test_{method}/wer.json").read_text())
        assert ("lm_weight" in scores) == ("lm" in method) == ("lodr_weight" in scores)
        assert ("boost" in scores) == ("boost" in method)
        if "lm" in method:
            assert (scores["lm_weight"], scores["lodr_weight"]) == (0.5, 0.4)  # the conf's
    assert (work / "exp/saved_model/saved_model.pb").is_file()
    again = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)
    assert again.returncode == 0 and again.stdout.count("done before, skipped") == 8


TINY_CONFORMER = [
    "model.encoder.d_model=16", "model.encoder.num_blocks=1", "model.encoder.num_heads=2",
    "model.encoder.kernel_size=3", "model.encoder.subsampling_filters=8",
    "model.predictor.embed_dim=8", "model.predictor.units=16", "model.joint_dim=16",
    # 2 epochs: under mixed_float16 the first windows overflow the initial loss scale and are
    # skipped (by design), and averaging needs 2 checkpoints of different updates.
    "data.num_buckets=3", "train.epochs=2",
    "train.warmup_updates=2", "train.checkpoint_every=1", "train.keep_checkpoints=3",
    "train.effective_batch_seconds=20",
]  # fmt: skip


@pytest.mark.slow
def test_librispeech_recipe_runs_every_stage_on_a_synthetic_corpus(tmp_path):
    """Every stage of recipes/librispeech/train.sh on a tiny synthetic LibriSpeech layout: one
    part given as an official-style archive (stage 0 extracts it), the real config with a
    tiny-model override, 10 s micro-batches accumulated 2 to an update, mixed precision."""
    asrkit = Path(sys.executable).parent / "asrkit"
    env = dict(os.environ, ASRKIT=str(asrkit))
    corpus = tmp_path / "corpus"
    made = subprocess.run([asrkit, "corpus", "synth", "--out", str(corpus), "--preset", "tiny"],
                          capture_output=True, text=True, timeout=300)  # fmt: skip
    assert made.returncode == 0, made.stderr[-2000:]
    data = tmp_path / "download"
    (data / "LibriSpeech").mkdir(parents=True)
    for part in ("train-clean-100", "dev-clean"):
        shutil.move(corpus / part, data / "LibriSpeech" / part)
    shutil.move(corpus / "test-clean", corpus / "LibriSpeech" / "test-clean")
    with tarfile.open(data / "test-clean.tar.gz", "w:gz") as archive:
        archive.add(corpus / "LibriSpeech", arcname="LibriSpeech")

    work = tmp_path / "work"
    cmd = ["bash", str(ROOT / "recipes/librispeech/train.sh"), "--data", str(data),
           "--work", str(work), "--train-parts", "train-clean-100",
           "--eval-parts", "dev-clean,test-clean", "--vocab", "28", "--speeds", "1.0,1.1",
           "--train-shards", "2", "--average", "2", "--micro-batch-seconds", "10"]  # fmt: skip
    for item in TINY_CONFORMER:
        cmd += ["--set", item]
    first = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    for n in range(7):
        assert (work / ".done" / str(n)).exists()
    assert (data / "LibriSpeech" / "test-clean").is_dir()  # extracted from the archive
    assert "2 per update = effective batch 20 s" in first.stdout + first.stderr
    config = (work / "exp" / "config.yaml").read_text()
    assert "precision: mixed_float16" in config and "d_model: 16" in config
    for part in ("dev-clean", "test-clean"):
        for method in ("greedy", "beam"):
            scores = json.loads((work / f"exp/decode/{part}-{method}/wer.json").read_text())
            assert scores["utterances"] > 0 and scores["weights"].endswith("averaged")
    assert (work / "exp/export/saved_model.pb").exists()
    calibrated = (work / "exp/timing.json").is_file()
    assert calibrated or "word times stay uncalibrated" in first.stdout
    assert ".flac\t" in first.stdout  # stage 6 transcribed a file with the export
    again = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)
    assert again.returncode == 0
    assert again.stdout.count("done before, skipped") == 7


def test_librispeech_recipe_names_what_is_missing(tmp_path):
    (tmp_path / "data" / "LibriSpeech" / "dev-clean").mkdir(parents=True)
    cmd = ["bash", str(ROOT / "recipes/librispeech/train.sh"), "--data", str(tmp_path / "data"),
           "--work", str(tmp_path / "work"), "--stop-stage", "0"]  # fmt: skip
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert run.returncode != 0
    assert "missing under" in run.stderr and "train-clean-360" in run.stderr
    assert "dev-clean" not in run.stderr.split("missing under")[1].split("(")[0]
    assert "never downloads" in run.stderr


FINETUNE = ROOT / "recipes/finetune/run.sh"


@pytest.mark.slow
def test_finetune_recipe_imports_plans_trains_and_compares_on_a_tiny_corpus(tmp_path):
    """A NeMo fixture model fine-tuned on another synthetic corpus (LibriSpeech layout):
    its own tokenizer lacks letters of that corpus, so keeping it is refused at the
    features naming them; with a new tokenizer every stage runs — WER before and after on
    the dev and test sets (a warning exactly when dev WER got worse), the best checkpoints
    averaged, a SavedModel; a rerun skips all."""
    from asrkit.data.synthetic import make_synthetic_corpus

    make_synthetic_corpus(tmp_path / "corpus", "tiny", seed=3, show_progress=False)
    asrkit = Path(sys.executable).parent / "asrkit"
    cmd = ["bash", str(FINETUNE), "--nemo", str(ROOT / "tests/data/nemo/rnnt.nemo"),
           "--data", str(tmp_path / "corpus"), "--work", str(tmp_path / "w"),
           "--memory", "2GiB", "--set", "train.epochs=2"]  # fmt: skip
    env = dict(os.environ, ASRKIT=str(asrkit))
    kept = subprocess.run([*cmd[:-4], "--work", str(tmp_path / "kept"), "--stop-stage", "3"],
                          env=env, capture_output=True, text=True, timeout=300)  # fmt: skip
    assert kept.returncode == 2, kept.stdout[-2000:] + kept.stderr[-2000:]
    said = kept.stdout + kept.stderr  # the unknown characters named, with their counts
    assert "characters the tokenizer cannot encode (" in said and "'x' x" in said, said[-2000:]
    cmd += ["--tokenizer", "new", "--vocab", "28"]
    first = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
    assert first.returncode == 0, first.stdout[-2000:] + first.stderr[-3000:]
    work = tmp_path / "w"
    assert all((work / ".done" / str(n)).exists() for n in range(9))
    wers = {}
    for part in ("dev", "test"):
        before = json.loads((work / f"decode_before/{part}/wer.json").read_text())
        after = json.loads((work / f"exp/decode_after/{part}/wer.json").read_text())
        assert before["utterances"] == after["utterances"] > 0
        assert f"{part} WER before fine-tuning: data/{part}.jsonl" in first.stdout
        assert f"{part} WER after fine-tuning:  data/{part}.jsonl" in first.stdout
        wers[part] = (round(100 * before["wer"], 2), round(100 * after["wer"], 2))
    assert ("made dev WER worse" in first.stdout) == (wers["dev"][1] > wers["dev"][0])
    # the best 2 of the 2 epochs by dev WER (keep_best), averaged, decoded and exported
    assert "averaged the best by dev WER: ckpt-" in first.stdout
    assert after["weights"] == "exp/best"
    # a new tokenizer: the weights shaped by the vocabulary start fresh, nothing else
    skipped = [line for line in first.stdout.splitlines() if "not loaded: " in line]
    assert "initialised" in first.stdout and "left fresh" not in first.stdout
    assert skipped and all("embedding" in line or "output" in line for line in skipped), skipped
    assert json.loads((work / "exp/plan.json").read_text())["budget_bytes"] == 2 * 2**30
    assert (work / "exp/saved_model/saved_model.pb").is_file()
    again = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)
    assert again.returncode == 0 and again.stdout.count("done before, skipped") == 9


@pytest.mark.slow
def test_finetune_recipe_with_lora_trains_factors_and_a_new_vocabularys_weights(tmp_path):
    """`--lora 2 --tokenizer new` on the NeMo fixture: the checkpoints hold the encoder's
    weights as imported and LoRA factors beside them, the new vocabulary's weights trained
    in full; the averaged model (merged) decodes and exports."""
    from asrkit.checkpoints import checkpoint_base, list_checkpoints, read_weights
    from asrkit.config import load_config
    from asrkit.data.synthetic import make_synthetic_corpus

    make_synthetic_corpus(tmp_path / "corpus", "tiny", seed=3, show_progress=False)
    env = dict(os.environ, ASRKIT=str(Path(sys.executable).parent / "asrkit"))
    work = tmp_path / "w"
    cmd = ["bash", str(FINETUNE), "--nemo", str(ROOT / "tests/data/nemo/rnnt.nemo"),
           "--data", str(tmp_path / "corpus"), "--work", str(work), "--tokenizer", "new",
           "--vocab", "28", "--lora", "2", "--set", "train.epochs=2"]  # fmt: skip
    run = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-3000:]
    base = read_weights(list_checkpoints(work / "pretrained/checkpoints")[-1])
    first, last = (read_weights(p) for p in list_checkpoints(work / "exp/checkpoints")[-2:])
    factors = [k for k in last if "lora_kernel" in k]
    assert factors and all(k.startswith("encoder.blocks.") for k in factors)
    for name, value in base.items():
        if name.startswith("encoder.") and value.dtype.kind == "f":
            np.testing.assert_array_equal(last[name], value, err_msg=name)  # frozen
    assert not np.array_equal(first["joint.output_layer.kernel"], last["joint.output_layer.kernel"])
    assert not any("lora" in k for k in read_weights(work / "exp/best"))  # merged
    # base-backed: the frozen weights are the imported base's, named by its path
    ref = checkpoint_base(list_checkpoints(work / "exp/checkpoints")[-1])
    assert ref is not None and ref.path.startswith(str((work / "pretrained").resolve()))
    assert "encoder.blocks.0.attention.qkv.kernel" in ref.names
    assert load_config(work / "exp/config.yaml").train.learning_rate == 1e-3
    assert (work / "exp/decode_after/test/wer.json").is_file()
    assert (work / "exp/saved_model/saved_model.pb").is_file()


def test_finetune_recipe_refuses_wrong_arguments_in_one_line(tmp_path):
    fake = tmp_path / "exp"
    fake.mkdir()
    (fake / "config.yaml").write_text(f"schema: {SCHEMA_VERSION}\n")
    jsonl = tmp_path / "jsonl"
    jsonl.mkdir()
    for name in ("train", "dev", "test"):
        (jsonl / f"{name}.jsonl").write_text('{"id": "a", "audio_path": "a.flac"}\n')
    (jsonl / "dev.jsonl").write_text('{"id": "a"}\nnot json\n')
    (tmp_path / "a.flac").write_bytes(b"")  # asrkit's audio_path: from where run.sh runs
    cases = {
        (): "give the pretrained model",
        ("--nemo", "no.nemo", "--data", str(tmp_path)): "no.nemo: no such file",
        ("--exp", str(tmp_path), "--data", str(tmp_path)): "not an asrkit experiment",
        ("--exp", str(fake)): "give the data",
        ("--exp", str(fake), "--data", "nowhere"): "nowhere: no such directory",
        ("--exp", str(fake), "--data", str(tmp_path), "--tokenizer", "old"): "keep or new",
        ("--exp", str(fake), "--data", str(tmp_path), "--lora", "0"): "a rank >= 1",
        ("--exp", str(fake), "--data", str(tmp_path), "--lora", "2", "--adapters", "8"):
            "choose one",
        ("--exp", str(fake), "--data", str(tmp_path), "--parts", "a,b"): "three parts",
        ("--exp", str(fake), "--data", str(tmp_path), "--best", "0"): "--best 0: a number",
        ("--frobnicate",): "unknown argument: --frobnicate",
        ("--exp", str(fake), "--data", str(jsonl), "--work", str(tmp_path / "w"),
         "--stage", "1", "--stop-stage", "1"): "dev.jsonl line 2: not a JSON object",
    }  # fmt: skip
    for args, words in cases.items():
        run = subprocess.run(["bash", str(FINETUNE), *args], capture_output=True, text=True,
                             timeout=60, cwd=tmp_path)  # fmt: skip
        assert run.returncode == 2 and words in run.stderr, (args, run.stderr)
        assert len(run.stderr.strip().splitlines()) == 1 and "Traceback" not in run.stderr
    written = (tmp_path / "w/data/train.jsonl").read_text()
    assert json.loads(written)["audio_path"] == str(tmp_path / "a.flac")  # from where it ran


def test_finetune_recipe_reads_nemo_manifests_with_paths_relative_to_the_manifest(tmp_path):
    """NeMo resolves a relative `audio_filepath` from the manifest's directory; the recipe's
    copies in <work>/data point at the same files (segments keep their offset), and audio
    found nowhere is named by manifest and line, with no half-written copy left."""
    data = tmp_path / "nemo_data"
    (data / "audio").mkdir(parents=True)
    (data / "audio/x.flac").write_bytes(b"")
    fake = tmp_path / "exp"
    fake.mkdir()
    (fake / "config.yaml").write_text(f"schema: {SCHEMA_VERSION}\n")
    line = {"audio_filepath": "audio/x.flac", "duration": 1.5, "offset": 2.0, "text": "hallo"}
    for name in ("train", "dev", "test"):
        (data / f"{name}.jsonl").write_text(json.dumps(line) + "\n")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    args = ["bash", str(FINETUNE), "--exp", str(fake), "--data", str(data), "--work", "w",
            "--stage", "1", "--stop-stage", "1"]  # fmt: skip
    run = subprocess.run(args, capture_output=True, text=True, timeout=60, cwd=elsewhere)
    assert run.returncode == 0, run.stderr
    for name in ("train", "dev", "test"):
        copied = json.loads((elsewhere / f"w/data/{name}.jsonl").read_text())
        assert copied == {**line, "audio_filepath": str(data / "audio/x.flac")}
    (data / "test.jsonl").write_text(json.dumps(line) + "\n" + json.dumps(
        {**line, "audio_filepath": "audio/missing.flac"}) + "\n")  # fmt: skip
    shutil.rmtree(elsewhere / "w")
    run = subprocess.run(args, capture_output=True, text=True, timeout=60, cwd=elsewhere)
    assert run.returncode == 2 and len(run.stderr.strip().splitlines()) == 1, run.stderr
    assert f"{data / 'test.jsonl'} line 2: audio_filepath audio/missing.flac: no such" in (
        run.stderr
    )
    assert not (elsewhere / "w/data/test.jsonl").exists()
    assert not list((elsewhere / "w/data").glob("*.partial"))


@pytest.mark.slow
def test_mini_recipe_trained_on_two_workers_scores_as_on_one_with_the_same_global_batch(
    tmp_path,
):
    """The tiny recipe's data stages, then its training (the demo's Conformer, shrunk; CTC
    head, SpecAugment, joined utterances) as two `asrkit train --workers` processes on
    loopback, and as one process whose micro-batch holds both workers' shares. Dropout off,
    so the two must reach the same weights (the accumulation contract across workers): the
    same update count, dev WER and greedy hypotheses, character for character (3 epochs of
    a tiny model emit long, wrong ones: hundreds of symbols that must all agree). With
    dropout on they differ within seed noise (RESULTS.md, "Several workers")."""
    from asrkit.checkpoints import CheckpointManager
    from tests.training.test_multi_worker import finish, start_workers

    asrkit = Path(sys.executable).parent / "asrkit"
    work = tmp_path / "w"
    data = subprocess.run(
        ["bash", str(ROOT / "recipes/mini/run.sh"), "--work", str(work), "--preset", "tiny",
         "--stop-stage", "3"],
        env=dict(os.environ, ASRKIT=str(asrkit), ASRKIT_NO_APT="1"), capture_output=True,
        text=True, timeout=600,
    )  # fmt: skip
    assert data.returncode == 0, data.stdout[-2000:] + data.stderr[-3000:]
    common = ["--config", str(ROOT / "recipes/mini/conf/conformer_cpu.yaml")]
    for item in [*TINY_MODEL, "model.encoder.dropout=0", "model.predictor.dropout=0",
                 "train.epochs=3", "train.accumulation_steps=2"]:  # fmt: skip
        common += ["--set", item]
    # 13 s per replica holds every joined run (<= 12 s): each global micro-batch is the same
    alone = subprocess.run(
        [asrkit, "train", *common, "--exp-dir", "one", "--set", "data.batch_seconds=26"],
        cwd=work, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert alone.returncode == 0, alone.stderr[-3000:]
    two = finish(start_workers([*common, "--exp-dir", "two", "--set", "data.batch_seconds=13"],
                               work), timeout=600)  # fmt: skip
    assert [code for code, _, _ in two] == [0, 0], two[0][2][-2000:] + two[1][2][-3000:]
    assert "x 2 replica(s)" in two[0][1]

    scores = {}
    for exp in ("one", "two"):
        latest = CheckpointManager(work / exp / "checkpoints").latest()
        state = json.loads((latest / "state.json").read_text())
        done = subprocess.run(
            [asrkit, "decode", "--exp-dir", exp, "--shards", "shards/dev", "--out",
             f"{exp}/decode_dev"], cwd=work, capture_output=True, text=True, timeout=300,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr[-3000:]
        wer = json.loads((work / exp / "decode_dev/wer.json").read_text())["wer"]
        scores[exp] = (state["updates"], wer, (work / exp / "decode_dev/hyp.txt").read_text())
    assert scores["one"][0] == scores["two"][0] > 0
    assert scores["one"][1:] == scores["two"][1:]
