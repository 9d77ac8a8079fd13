"""Commands speak like a tool: a user error is one line `asrkit <command>: error: ...` on
stderr and exit code 2, never a traceback, and TensorFlow's start-up chatter stays quiet."""

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from asrkit.cli.main import main
from asrkit.config import SCHEMA_VERSION

ASRKIT = Path(sys.executable).parent / "asrkit"
ROOT = Path(__file__).resolve().parents[2]
CLIP = ROOT / "tests/data/realspeech/test-real/9002/90021/9002-90021-0000.flac"


def _record_config(exp, tokenizer: str) -> None:
    """A recorded config of this asrkit that names a tokenizer directory."""
    config = {"schema": SCHEMA_VERSION, "data": {"tokenizer": tokenizer}}
    (exp / "config.yaml").write_text(json.dumps(config))


def _one_error_line(capsys, command: str) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert err[0].startswith(f"asrkit {command}: error: "), err
    return err[0]


@pytest.mark.parametrize(
    ("argv", "command", "names"),
    [
        (["prepare", "librispeech", "--root", "{tmp}/nothing", "--parts", "dev-clean",
          "--out", "{tmp}/data"], "prepare", "{tmp}/nothing/dev-clean"),
        (["decode", "--exp-dir", "{tmp}/nowhere", "--manifest", "m.jsonl"], "decode",
         "{tmp}/nowhere: not an experiment directory"),
        (["transcribe", "--exp-dir", "{tmp}/nowhere", "a.flac"], "transcribe",
         "no such audio file: a.flac"),
        (["export", "--exp-dir", "{tmp}/nowhere", "--out", "{tmp}/x"], "export", "{tmp}/nowhere"),
        (["average", "--exp-dir", "{tmp}", "--last", "2"], "average", "no checkpoint"),
        (["train", "--config", "{tmp}/missing.yaml", "--exp-dir", "{tmp}/e"], "train",
         "{tmp}/missing.yaml: no such config file"),
        (["train", "--config", "{tmp}/bad.yaml", "--exp-dir", "{tmp}/e"], "train",
         "unknown key 'epoch' in section 'train'"),
        (["train", "--set", "train.epochs=0", "--exp-dir", "{tmp}/e"], "train",
         "train.epochs must be >= 1"),
        (["train", "--set", "data.train_shards={tmp}", "--set", "data.tokenizer={tmp}/tok",
          "--exp-dir", "{tmp}/e"], "train", "{tmp}/tok/tokenizer.model missing"),
        (["features", "extract", "--manifest", "{tmp}/m.jsonl", "--tokenizer", "{tmp}/tok",
          "--out", "{tmp}/s"], "features extract", "{tmp}/tok/tokenizer.json: missing"),
        (["features", "cmvn", "--shards", "{tmp}", "--out", "{tmp}/c.json"], "features cmvn",
         "{tmp}/shards.json: missing"),
        (["tokenizer", "train", "--manifest", "{tmp}/none.jsonl", "--vocab-size", "8",
          "--out", "{tmp}/t"], "tokenizer train", "{tmp}/none.jsonl"),
        (["corpus", "synth", "--out", "{tmp}/c", "--natural-share", "1.5"], "corpus synth",
         "--natural-share must be in [0, 1], got 1.5"),
        (["calibrate", "--exp-dir", "{tmp}/nowhere", "--manifest", "{tmp}/m.jsonl"],
         "calibrate", "{tmp}/m.jsonl"),
        (["calibrate", "--exp-dir", "{tmp}", "--manifest", "{tmp}/one.jsonl"], "calibrate",
         "one.jsonl:1: utterance u1: audio {tmp}/u1.flac: no such file"),
        (["calibrate", "--exp-dir", "{tmp}", "--manifest", "{tmp}/one.jsonl", "--limit", "0"],
         "calibrate", "--limit must be >= 1, got 0"),
        (["transcribe", "--exp-dir", "{tmp}/nowhere", "--beam", "0", "{clip}"], "transcribe",
         "--beam must be >= 1, got 0"),
        (["transcribe", "--exp-dir", "{tmp}/nowhere", "--nbest", "4", "--format", "json",
          "{clip}"], "transcribe", "--nbest 4: greedy search finds one hypothesis; add "
         "--method beam --beam 4"),
        (["decode", "--exp-dir", "{tmp}/nowhere", "--manifest", "m.jsonl", "--method", "beam",
          "--beam", "-1"], "decode", "--beam must be >= 1, got -1"),
        (["train", "--config", "{tmp}/broken.yaml", "--exp-dir", "{tmp}/e"], "train",
         "{tmp}/broken.yaml: not valid YAML: line 3, column 8: mapping values are not allowed"),
        (["train", "--exp-dir", "{tmp}/e", "--workers", "node1:2222"], "train",
         "--workers 'node1:2222': give every worker's host:port, comma-separated (at least two"),
        (["train", "--exp-dir", "{tmp}/e", "--workers", "a:1,b:2", "--worker-index", "2"],
         "train", "--worker-index 2: the list has 2 workers, so it is 0 to 1"),
        (["train", "--exp-dir", "{tmp}/e", "--worker-index", "1"], "train",
         "--worker-index needs --workers"),
        (["train", "--exp-dir", "{tmp}/e", "--start-timeout", "0"], "train",
         "--start-timeout 0: give seconds > 0"),
        (["decode", "--exp-dir", "{tmp}/nowhere", "--manifest", "m.jsonl", "--boost",
          "{tmp}/none.txt"], "decode", "--boost {tmp}/none.txt: no such phrase list"),
        (["decode", "--exp-dir", "{tmp}/nowhere", "--manifest", "m.jsonl", "--boost",
          "{tmp}/boost.txt"], "decode", "--boost {tmp}/boost.txt:2: weight 'much' is not"),
        (["transcribe", "--exp-dir", "{tmp}/nowhere", "--boost", "{tmp}/bad.yaml",
          "--boost-weight", "-2", "{clip}"], "transcribe", "--boost-weight must be a number >= 0"),
        (["transcribe", "--exp-dir", "{tmp}/nowhere", "--boost", "{tmp}/bad.yaml",
          "--method", "ctc", "{clip}"], "transcribe", "--boost works in greedy and beam search"),
        (["decode", "--exp-dir", "{tmp}/nowhere", "--manifest", "m.jsonl", "--lm",
          "{tmp}/bad.arpa"], "decode", "--lm {tmp}/bad.arpa:5: probability 'x' is not a log10"),
        (["decode", "--exp-dir", "{tmp}/nowhere", "--manifest", "m.jsonl", "--lm",
          "{tmp}/none.arpa"], "decode", "--lm {tmp}/none.arpa: no such file"),
        (["decode", "--exp-dir", "{tmp}/nowhere", "--manifest", "m.jsonl", "--lodr",
          "{tmp}/bad.arpa"], "decode", "--lodr subtracts a low-order LM beside an external"),
        (["transcribe", "--model", "{tmp}/nowhere", "--precision", "bfloat16", "{clip}"],
         "transcribe", "--precision bfloat16: with --exp-dir on whole recordings"),
        (["transcribe", "--exp-dir", "{tmp}/nowhere", "--streaming", "--precision", "bfloat16",
          "{clip}"], "transcribe", "--precision bfloat16: with --exp-dir on whole recordings"),
        (["transcribe", "--exp-dir", "{tmp}/nowhere", "--lm-weight", "0.5", "{clip}"],
         "transcribe", "--lm-weight without --lm"),
        (["lm", "train", "--tokenizer", "{tmp}", "--text", "{tmp}/bad.yaml", "--out",
          "{tmp}/lm.arpa"], "lm train", "--tokenizer {tmp}: no tokenizer there"),
        (["lm", "train", "--tokenizer", "{tmp}", "--text", "{tmp}/bad.yaml", "--out", "{tmp}"],
         "lm train", "--out {tmp}: is a directory; give a file name"),
        (["corpus", "text", "--count", "3", "--out", "{tmp}"], "corpus text",
         "--out {tmp}: is a directory; give a file name"),
        (["lm", "train", "--tokenizer", "{tmp}", "--text", "{tmp}/bad.yaml", "--order", "0",
          "--out", "{tmp}/lm.arpa"], "lm train", "--order must be 1 to 10, got 0"),
        (["plan", "--exp-dir", "{tmp}/new", "--memory", "2GiB"], "plan",
         "--exp-dir {tmp}/new: not an experiment yet (no config.yaml); give the model and "
         "data to use with --config CONF"),
    ],
)  # fmt: skip
def test_user_errors_are_one_line_and_exit_2(tmp_path, capsys, argv, command, names):
    (tmp_path / "bad.yaml").write_text("train:\n  epoch: 3\n")
    (tmp_path / "broken.yaml").write_text("train:\n  epochs: 3\n  lr: 1: 2\n")
    (tmp_path / "boost.txt").write_text("NEW YORK\nKUBERNETES\tmuch\n")
    (tmp_path / "bad.arpa").write_text(
        "\\data\\\nngram 1=2\n\n\\1-grams:\nx\t</s>\n-1\ta\n\n\\end\\\n"
    )
    one = {"id": "u1", "audio_path": f"{tmp_path}/u1.flac", "duration": 1.0, "text": "A",
           "speaker": "1"}  # fmt: skip
    (tmp_path / "one.jsonl").write_text(json.dumps(one) + "\n")
    argv = [a.format(tmp=tmp_path, clip=CLIP) for a in argv]
    assert main(argv) == 2
    line = _one_error_line(capsys, command)
    assert names.format(tmp=tmp_path) in line


@pytest.mark.parametrize(
    ("argv", "created"),
    [
        (["decode", "--exp-dir", "{tmp}/nowhere", "--manifest", "m.jsonl", "--out",
          "{tmp}/results/test"], "results"),
        (["average", "--exp-dir", "{tmp}", "--last", "5"], "averaged"),
        (["plan", "--config", "{tmp}/conf.yaml", "--exp-dir", "{tmp}/planned/exp", "--memory",
          "1GiB"], "planned"),
    ],
    ids=["decode --out", "average --last", "plan --exp-dir"],
)  # fmt: skip
def test_a_failed_command_leaves_no_directory_it_created(tmp_path, capsys, argv, created):
    """The output directories a command made before it failed are taken back; one that
    existed before, or one with a file in it, stays."""
    (tmp_path / "conf.yaml").write_text(f"data: {{tokenizer: {tmp_path}/no-tokenizer}}\n")
    (tmp_path / "keep").mkdir()
    assert main([a.format(tmp=tmp_path) for a in argv]) == 2
    _one_error_line(capsys, argv[0])
    assert not (tmp_path / created).exists()
    assert (tmp_path / "keep").is_dir()


def test_a_mistake_run_as_a_command_prints_no_traceback_and_no_tensorflow_noise(tmp_path):
    run = subprocess.run(
        [ASRKIT, "decode", "--exp-dir", str(tmp_path / "nowhere"), "--manifest", "m.jsonl"],
        capture_output=True, text=True, timeout=120, cwd=tmp_path,
    )  # fmt: skip
    assert run.returncode == 2
    assert run.stderr.strip().splitlines() == [
        f"asrkit decode: error: {tmp_path / 'nowhere'}: not an experiment directory "
        "(no config.yaml; made by asrkit train)"
    ]
    # A mistake found after TensorFlow started (the experiment's tokenizer is missing):
    # one line, and TensorFlow's own lines only with --verbose.
    exp = tmp_path / "exp"
    exp.mkdir()
    (exp / "config.yaml").write_text(
        json.dumps({"schema": SCHEMA_VERSION, "data": {"tokenizer": "tok"}})
    )
    (tmp_path / "u1.flac").write_bytes(b"")
    one = {"id": "u1", "audio_path": f"{tmp_path}/u1.flac", "duration": 1.0, "text": "A",
           "speaker": "1"}  # fmt: skip
    (tmp_path / "m.jsonl").write_text(json.dumps(one) + "\n")
    argv = ["decode", "--exp-dir", str(exp), "--manifest", str(tmp_path / "m.jsonl")]
    quiet = subprocess.run([ASRKIT, *argv], capture_output=True, text=True, timeout=120)
    assert quiet.returncode == 2 and len(quiet.stderr.strip().splitlines()) == 1, quiet.stderr
    assert "tok/tokenizer.json: missing" in quiet.stderr
    verbose = subprocess.run([ASRKIT, "--verbose", *argv], capture_output=True, text=True,
                             timeout=120)  # fmt: skip
    assert verbose.returncode == 2 and len(verbose.stderr.strip().splitlines()) > 1


def test_debug_shows_the_traceback(tmp_path):
    with pytest.raises(FileNotFoundError):
        main(["--debug", "decode", "--exp-dir", str(tmp_path), "--manifest", "m.jsonl"])


def test_an_experiment_without_its_tokenizer_is_a_clear_error(tmp_path, capsys):
    exp = tmp_path / "exp"
    exp.mkdir()
    (exp / "config.yaml").write_text(
        json.dumps({"schema": SCHEMA_VERSION, "data": {"tokenizer": "tokenizer"}})
    )
    (tmp_path / "u1.flac").write_bytes(b"")  # looked at only once the model loaded
    one = {"id": "u1", "audio_path": f"{tmp_path}/u1.flac", "duration": 1.0, "text": "A",
           "speaker": "1"}  # fmt: skip
    (tmp_path / "m.jsonl").write_text(json.dumps(one) + "\n")
    assert main(["decode", "--exp-dir", str(exp), "--manifest", f"{tmp_path}/m.jsonl"]) == 2
    assert f"{exp}/tokenizer/tokenizer.json: missing" in _one_error_line(capsys, "decode")


def test_tensorflow_native_logging_stays_off_the_terminal_after_start_up(tmp_path):
    # cuInit is probed when devices are first listed and oneDNN complains at the first
    # boolean op: both after the import, both straight to descriptor 2.
    script = (
        "import sys\n"
        "from asrkit.cli.main import quiet_tensorflow\n"
        "quiet_tensorflow(verbose=False)\n"
        "import tensorflow as tf\n"
        "tf.config.list_physical_devices()\n"
        "print(bool(tf.reduce_any(tf.constant([True]) & tf.constant([False]))), file=sys.stderr)\n"
        "tf.get_logger().warning('a deprecation notice')\n"
        "print('ours', file=sys.stderr)\n"
    )
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         timeout=120, cwd=tmp_path)  # fmt: skip
    assert run.returncode == 0, run.stderr
    assert run.stderr.splitlines() == ["False", "ours"]


def test_a_mistyped_set_key_is_blamed_on_set_fast_with_the_nearest_key(tmp_path):
    """Named as --set (not the config file, which is fine), before TensorFlow is imported."""
    started = time.monotonic()
    run = subprocess.run(
        [ASRKIT, "train", "--config", str(ROOT / "recipes/mini/conf/conformer_cpu.yaml"),
         "--exp-dir", str(tmp_path / "e"), "--set", "train.epoch=1"],
        capture_output=True, text=True, cwd=tmp_path,
    )  # fmt: skip
    seconds = time.monotonic() - started
    assert run.returncode == 2
    (line,) = run.stderr.strip().splitlines()
    assert line.startswith("asrkit train: error: --set train.epoch=1: unknown key 'epoch'")
    assert "did you mean 'train.epochs'?" in line and "conformer_cpu.yaml" not in line
    assert seconds < 2.0, seconds
    assert not (tmp_path / "e").exists()


def test_an_output_under_a_file_fails_first_naming_the_option(tmp_path, capsys):
    """A path under a regular file cannot be created even by root: every command says so
    before any work (no experiment is even needed to find that out)."""
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    cases = {
        "train": ["train", "--set", "train.epochs=1", "--exp-dir", f"{blocker}/exp"],
        "decode": ["decode", "--exp-dir", str(tmp_path), "--manifest", "m.jsonl", "--out",
                   f"{blocker}/dec"],
        "export": ["export", "--exp-dir", str(tmp_path), "--out", f"{blocker}/sm"],
        "average": ["average", "--exp-dir", str(tmp_path), "--last", "2", "--out",
                    f"{blocker}/avg"],
        "transcribe": ["transcribe", "--exp-dir", str(tmp_path), "--out-dir",
                       f"{blocker}/srt", str(blocker)],
    }  # fmt: skip
    for command, argv in cases.items():
        assert main(argv) == 2, command
        line = _one_error_line(capsys, command)
        assert f"{blocker}/" in line and "a part of the path is a file" in line, line
    assert blocker.read_text() == ""


def test_results_are_kept_when_the_target_fails_late(tmp_path, monkeypatch):
    from asrkit.outputs import OutputError, write_files

    blocker = tmp_path / "a-file"
    blocker.write_text("")
    with pytest.raises(OutputError, match="they are kept in") as err:
        write_files(blocker / "out", {"hyp.txt": "u1 HELLO\n", "wer.json": "{}\n"})
    kept = Path(str(err.value).rsplit("kept in ", 1)[1])
    assert (kept / "hyp.txt").read_text() == "u1 HELLO\n"
    assert (kept / "wer.json").read_text() == "{}\n"


def test_empty_and_broken_manifests_are_named_with_their_line(tmp_path, capsys):
    exp = tmp_path / "exp"
    exp.mkdir()
    (exp / "config.yaml").write_text(
        json.dumps({"schema": SCHEMA_VERSION, "data": {"tokenizer": "tokenizer"}})
    )
    (tmp_path / "zero.jsonl").write_text("")
    good = {"id": "u1", "audio_path": f"{tmp_path}/u1.flac", "duration": 1.0, "text": "A",
            "speaker": "1"}  # fmt: skip
    (tmp_path / "u1.flac").write_bytes(b"")
    missing = {**good, "id": "u2", "audio_path": "/nonexistent/x.flac"}
    (tmp_path / "two.jsonl").write_text(json.dumps(good) + "\n\n" + json.dumps(missing) + "\n")
    assert main(["decode", "--exp-dir", str(exp), "--manifest", f"{tmp_path}/zero.jsonl"]) == 2
    line = _one_error_line(capsys, "decode")
    assert f"{tmp_path}/zero.jsonl: the manifest holds no utterances" in line
    argv = ["tokenizer", "train", "--manifest", f"{tmp_path}/zero.jsonl", "--vocab-size", "8",
            "--out", f"{tmp_path}/tok"]  # fmt: skip
    assert main(argv) == 2
    line = _one_error_line(capsys, "tokenizer train")
    assert "zero.jsonl: no transcript" in line and "train_tokenizer" not in line
    assert main(["decode", "--exp-dir", str(exp), "--manifest", f"{tmp_path}/two.jsonl"]) == 2
    line = _one_error_line(capsys, "decode")
    assert f"{tmp_path}/two.jsonl:3: utterance u2: audio /nonexistent/x.flac: no such file" in line


def test_a_native_crash_still_prints_while_start_up_noise_does_not():
    """Descriptor 2 goes through the noise filter, not to /dev/null: absl's info lines are
    dropped, a fatal line and an abort are not."""
    code = "\n".join([
        "import os",
        "from asrkit.cli.main import quiet_tensorflow",
        "quiet_tensorflow(False)",
        "import tensorflow as tf",
        "tf.config.list_physical_devices()",
        "os.write(2, b'I0000 00:00:1796158465.716390    2429 port.cc:153] oneDNN is on\\n')",
        "os.write(2, b'F0000 00:00:1796158465.716390    2429 op.cc:7] Check failed: a == b\\n')",
        "os.abort()",
    ])  # fmt: skip
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert run.returncode != 0
    assert "Check failed: a == b" in run.stderr
    assert "oneDNN" not in run.stderr and "cuInit" not in run.stderr
    assert "absl::InitializeLog" not in run.stderr


def test_user_errors_cost_well_under_two_seconds_as_commands(tmp_path):
    """Arguments, paths, experiments and manifests are checked before TensorFlow loads."""
    cases = [
        ["decode", "--exp-dir", str(tmp_path / "none"), "--manifest", "m.jsonl"],
        ["export", "--exp-dir", str(tmp_path / "none"), "--out", str(tmp_path / "sm")],
        ["transcribe", "--exp-dir", str(tmp_path / "none"), str(tmp_path / "missing.flac")],
        ["calibrate", "--exp-dir", str(tmp_path), "--manifest", "m.jsonl", "--limit", "0"],
        ["prepare", "librispeech", "--root", str(tmp_path / "nope"), "--parts", "dev-clean",
         "--out", str(tmp_path / "data")],
        ["plan", "--exp-dir", str(tmp_path / "p"), "--set", "train.epochz=2"],
    ]  # fmt: skip
    for argv in cases:
        started = time.monotonic()
        run = subprocess.run([ASRKIT, *argv], capture_output=True, text=True, cwd=tmp_path)
        seconds = time.monotonic() - started
        assert run.returncode == 2, (argv, run.stderr)
        assert len(run.stderr.strip().splitlines()) == 1, run.stderr
        assert seconds < 2.0, (argv[0], seconds)


def test_a_beam_below_one_is_refused_as_a_user_error():
    import argparse

    from asrkit.cli.options import search_options
    from asrkit.config import ExperimentConfig
    from asrkit.errors import InputError

    with pytest.raises(InputError, match="--beam must be >= 1, got 0"):
        search_options(argparse.Namespace(method="beam", beam=0), ExperimentConfig())
    assert search_options(argparse.Namespace(method="beam", beam=2), ExperimentConfig()).beam == 2


def test_a_worker_whose_chief_never_comes_stops_in_one_line_and_leaves_nothing(tmp_path):
    """`asrkit train --workers` on a machine whose chief is not there: one line naming the
    chief after --start-timeout, exit 2, and the experiment directory it made taken back."""
    from tests.training.test_multi_worker import free_ports

    workers = ",".join(f"127.0.0.1:{p}" for p in free_ports(2))
    started = time.monotonic()
    done = subprocess.run(
        [ASRKIT, "train", "--exp-dir", str(tmp_path / "exp"), "--workers", workers,
         "--worker-index", "1", "--start-timeout", "1"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in done.stderr, done.stderr
    chief = workers.split(",")[0]
    assert lines[0].startswith(f"asrkit train: error: the chief, worker 0 ({chief}), did not")
    assert not (tmp_path / "exp").exists()
    assert time.monotonic() - started < 60


def test_what_an_experiments_files_answer_is_refused_before_tensorflow_loads(tmp_path):
    """--method ctc without a CTC head, bfloat16 for an LSTM encoder, a look-ahead the model
    was not trained with, an LM over words instead of the model's pieces and a bad phrase
    list: each refused in one line from the recorded config and tokenizer, by a process
    that never imported TensorFlow."""
    from asrkit.importers.nemo_model import import_nemo

    exp = tmp_path / "stream"
    import_nemo(ROOT / "tests/data/nemo/streaming.nemo", exp)  # RNN-T, look-aheads 3 7 1 0
    manifest = tmp_path / "m.jsonl"
    manifest.write_text(json.dumps({"id": "u1", "audio_path": str(CLIP), "duration": 3.0,
                                    "text": "HELLO", "speaker": "s"}) + "\n")  # fmt: skip
    words = tmp_path / "words.arpa"
    words.write_text("\\data\\\nngram 1=4\n\n\\1-grams:\n-1.0 <s>\n-0.5 HELLO\n-0.5 WORLD\n"
                     "-0.5 </s>\n\n\\end\\\n")  # fmt: skip
    phrases = tmp_path / "boost.txt"
    phrases.write_text("kubernetes\tmany\n")
    decode = ["decode", "--exp-dir", str(exp), "--manifest", str(manifest)]
    lstm = tmp_path / "lstm"
    lstm.mkdir()
    (lstm / "config.yaml").write_text(json.dumps({
        "schema": SCHEMA_VERSION, "data": {"tokenizer": "tok"},
        "model": {"encoder": {"kind": "lstm"}},
    }))  # fmt: skip
    cases = [
        ([*decode, "--method", "ctc"], "has no CTC head"),
        (["decode", "--exp-dir", str(lstm), "--manifest", str(manifest), "--precision",
          "bfloat16"], "--precision bfloat16: runs a Conformer encoder; this model's is lstm"),
        (["transcribe", "--exp-dir", str(exp), "--lookahead-frames", "5", str(CLIP)],
         "trained with the look-aheads [3, 7, 1, 0]"),
        ([*decode, "--lm", str(words)], "2 of the LM's 2 words are not pieces of this model"),
        ([*decode, "--boost", str(phrases)], "boost.txt:1: weight 'many' is not a number"),
    ]  # fmt: skip
    code = ("import json, sys\nfrom asrkit.cli.main import main\nrc = main(sys.argv[1:])\n"
            "print(json.dumps([rc, 'tensorflow' in sys.modules]))")  # fmt: skip
    for argv, says in cases:
        run = subprocess.run([sys.executable, "-c", code, *argv], capture_output=True,
                             text=True, cwd=tmp_path, timeout=120)  # fmt: skip
        rc, loaded = json.loads(run.stdout.strip().splitlines()[-1])
        assert rc == 2 and not loaded, (argv, run.stderr)
        assert says in run.stderr and len(run.stderr.strip().splitlines()) == 1, run.stderr
