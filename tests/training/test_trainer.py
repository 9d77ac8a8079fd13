"""asrkit-train end to end on the tiny synthetic corpus: the loss falls, and a run resumed
from a mid-epoch checkpoint — also after a real SIGKILL — ends with the same weights."""

import io
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf

from asrkit.checkpoints import (
    CheckpointManager,
    checkpoint_damage,
    list_checkpoints,
    named_variables,
)
from asrkit.config import load_config
from asrkit.data.manifest import read_manifest
from asrkit.data.records import write_shards
from asrkit.tokenizer import train_tokenizer
from asrkit.training.setup import config_cautions
from asrkit.training.trainer import DataPlanChanged, train

ROOT = Path(__file__).resolve().parents[2]
CONFIG = """
model:
  encoder: {kind: lstm, lstm_units: 24, lstm_layers: 1, subsampling_filters: 8, dropout: 0.1}
  predictor: {embed_dim: 8, units: 24, dropout: 0.1}
  joint_dim: 24
data:
  train_shards: shards/train
  dev_shards: shards/dev
  tokenizer: tokenizer
  batch_seconds: 6.0
  num_buckets: 2
train:
  epochs: 3
  accumulation_steps: 2
  learning_rate: 0.003
  warmup_updates: 2
  checkpoint_every: 1
  keep_checkpoints: 100
  probe_memory: false  # the probe has its own tests (test_probe)
"""
# The same with a small Conformer (the encoder keys of one kind only: switching the kind
# with --set on a config that holds LSTM keys is an error naming them).
CONFORMER_CONFIG = CONFIG.replace(
    "{kind: lstm, lstm_units: 24, lstm_layers: 1, subsampling_filters: 8, dropout: 0.1}",
    "{kind: conformer, d_model: 16, num_blocks: 1, num_heads: 2, kernel_size: 5,\n"
    "            subsampling_filters: 8, dropout: 0.1}",
)
assert "kind: conformer" in CONFORMER_CONFIG


@pytest.fixture(scope="module")
def workdir(workdir):
    (workdir / "conf.yaml").write_text(CONFIG)
    (workdir / "conformer.yaml").write_text(CONFORMER_CONFIG)
    return workdir


def _weights(checkpoint_dir: Path) -> dict:
    """Every saved value: model weights, dropout RNG states, optimizer slots, iterations."""
    reader = tf.train.load_checkpoint(str(checkpoint_dir / "ckpt"))
    names = [n for n in reader.get_variable_to_shape_map() if "CHECKPOINTABLE" not in n]
    return {n: reader.get_tensor(n) for n in names}


@pytest.fixture(scope="module")
def uninterrupted(workdir):
    cwd = os.getcwd()
    os.chdir(workdir)
    try:
        result = train(load_config(workdir / "conf.yaml"), workdir / "exp_a", log=lambda *_: None)
    finally:
        os.chdir(cwd)
    return result


def test_training_learns_and_checkpoints(workdir, uninterrupted):
    losses = uninterrupted.epoch_losses
    assert len(losses) == 3 and losses[-1] < losses[0] * 0.8
    # The dev WER reported is that of the final weights: a decode of the last checkpoint.
    from asrkit.data.pipeline import pipeline_config
    from asrkit.decoding.recogniser import Recogniser
    from asrkit.decoding.runner import decode_shards
    from asrkit.experiment import load_experiment

    final = load_experiment(workdir / "exp_a")
    decoded = decode_shards(Recogniser.of(final), workdir / "shards" / "dev", final.tokenizer,
                            pipeline_config(final.config))  # fmt: skip
    assert uninterrupted.dev_wer == pytest.approx(decoded.rates.wer, abs=1e-9)
    checkpoints = CheckpointManager(workdir / "exp_a" / "checkpoints").checkpoints()
    assert len(checkpoints) >= uninterrupted.state.updates
    # Each epoch-end checkpoint records the dev WER of its own weights (what
    # train.keep_best ranks by), the mid-epoch ones none.
    from asrkit.checkpoints import read_state
    from asrkit.curves import read_curves

    states = [read_state(p) for p in checkpoints]
    assert states[-1].dev_wer == pytest.approx(uninterrupted.dev_wer, abs=1e-12)
    dev_points = dict(read_curves(workdir / "exp_a").dev_wer)
    recorded = {s.updates: s.dev_wer for s in states if s.dev_wer is not None}
    assert recorded and set(recorded) <= set(dev_points)
    for updates, wer in recorded.items():
        assert wer == pytest.approx(dev_points[updates], abs=1e-6)
    assert len(recorded) < len(states)  # checkpoint_every's mid-epoch ones have none
    # The lengths trained on are recorded (what transcribe keeps its windows within).
    from asrkit.data.records import shard_counts
    from asrkit.experiment import read_training_lengths

    lengths = read_training_lengths(workdir / "exp_a")
    _, frames, _ = shard_counts(workdir / "shards" / "train")
    assert lengths.utterances == len(frames)  # every record usable here
    assert lengths.max_seconds == pytest.approx(frames.max() * 0.01, abs=1e-3)
    assert lengths.median_seconds == pytest.approx(np.median(frames) * 0.01, abs=1e-3)
    assert (workdir / "exp_a" / "config.yaml").read_text().startswith("# asrkit")
    tags = set()
    for event_file in (workdir / "exp_a" / "tensorboard").glob("events.*"):
        for event in tf.compat.v1.train.summary_iterator(str(event_file)):
            tags.update(v.tag for v in event.summary.value)
    expected = {"train/loss", "train/learning_rate", "train/grad_norm", "dev/wer",
                "train/skipped_windows", "train/audio_seconds_per_second"}  # fmt: skip
    assert expected <= tags, expected - tags


def test_plot_draws_the_training_curves(workdir, uninterrupted, tmp_path, capsys):
    from asrkit.cli.main import main
    from asrkit.curves import read_curves

    curves = read_curves(workdir / "exp_a")
    assert len(curves.dev_wer) == 3  # one per epoch
    assert len(curves.loss) == uninterrupted.state.updates
    assert [s for s, _ in curves.loss] == list(range(1, uninterrupted.state.updates + 1))
    assert (
        main(["plot", "--exp-dir", str(workdir / "exp_a"), "--out", str(tmp_path / "c.png")]) == 0
    )
    assert "3 dev points" in capsys.readouterr().out
    png = (tmp_path / "c.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10_000
    width, height = int.from_bytes(png[16:20], "big"), int.from_bytes(png[20:24], "big")
    assert (width, height) == (880, 770)  # 8 x 7 inches at 110 dpi


class _Terminal(io.StringIO):
    def isatty(self):
        return True


def test_progress_draws_a_bar_on_a_terminal(monkeypatch):
    from asrkit.checkpoints import TrainState
    from asrkit.training.callbacks import TrainingProgress

    class Optimizer:
        iterations = tf.Variable(0, dtype=tf.int64)

    class Model:
        optimizer = Optimizer()

    config = load_config(None, ["train.checkpoint_every=0"])
    terminal, lines = _Terminal(), []
    writer = tf.summary.create_noop_writer()
    clock = iter(range(100, 200))
    monkeypatch.setattr("asrkit.training.callbacks.time.monotonic", lambda: float(next(clock)))
    progress = TrainingProgress(None, TrainState(0, 0, 0), 10, 3.0, config, writer,
                                lines.append, stream=terminal)  # fmt: skip
    progress.set_model(Model())
    for batch in range(4):
        Model.optimizer.iterations.assign_add(1)
        progress.on_train_batch_end(batch, {"loss": 1.5, "learning_rate": 1e-3})
    progress.on_epoch_end(0)
    drawn = terminal.getvalue()
    assert drawn.count("\r") >= 3 and drawn.endswith("\n") and not lines
    last = drawn.strip().split("\r")[-1]
    assert "4/10" in last and "updates 4" in last and "loss 1.500" in last
    assert "audio s/s" in last


def _copy_up_to(workdir, name: str, keep_after_middle: int):
    """exp_a copied to `name` without its checkpoints past the middle one and
    `keep_after_middle` more: (the copy, its checkpoints as they were)."""
    copy = workdir / name
    shutil.copytree(workdir / "exp_a", copy)
    checkpoints = CheckpointManager(copy / "checkpoints").checkpoints()
    for later in checkpoints[len(checkpoints) // 2 + 1 + keep_after_middle :]:
        shutil.rmtree(later)
    return copy, checkpoints


def _train_in(workdir, exp, log=lambda *_: None):
    cwd = os.getcwd()
    os.chdir(workdir)
    try:
        return train(load_config(workdir / "conf.yaml"), exp, log=log)
    finally:
        os.chdir(cwd)


def _assert_ends_as_uninterrupted(workdir, exp):
    final_a = CheckpointManager(workdir / "exp_a" / "checkpoints").latest()
    a, b = _weights(final_a), _weights(CheckpointManager(exp / "checkpoints").latest())
    assert a.keys() == b.keys() and len(a) > 5
    for name in a:
        np.testing.assert_array_equal(a[name], b[name], err_msg=name)


def test_resume_from_a_mid_epoch_checkpoint_ends_identical(workdir, uninterrupted):
    resumed, checkpoints = _copy_up_to(workdir, "exp_b", 0)
    middle = checkpoints[len(checkpoints) // 2]
    result = _train_in(workdir, resumed)
    assert middle.exists() and result.state.updates == uninterrupted.state.updates
    _assert_ends_as_uninterrupted(workdir, resumed)


def test_a_resume_falls_back_past_a_damaged_checkpoint_and_ends_identical(
    workdir, uninterrupted, recwarn
):
    """The newest checkpoint truncated (a partial copy, a full disk): the resume warns once,
    keeps the damaged one aside, continues from the one before and ends bit-identical to the
    uninterrupted run."""
    resumed, checkpoints = _copy_up_to(workdir, "exp_damaged", 1)
    middle, damaged = checkpoints[len(checkpoints) // 2], checkpoints[len(checkpoints) // 2 + 1]
    data_file = damaged / "ckpt.data-00000-of-00001"
    with open(data_file, "r+b") as f:
        f.truncate(data_file.stat().st_size // 2)
    lines = []
    result = _train_in(workdir, resumed, log=lines.append)
    warned = [str(w.message) for w in recwarn if "resuming from the checkpoint before" in
              str(w.message)]  # fmt: skip
    assert len(warned) == 1 and str(data_file) in warned[0] and middle.name in warned[0]
    assert any(f"resumed from {middle.name}" in line for line in lines)
    aside = damaged.with_name(damaged.name + ".damaged")
    assert aside.is_dir() and (aside / "ckpt.data-00000-of-00001").exists()
    assert result.state.updates == uninterrupted.state.updates
    _assert_ends_as_uninterrupted(workdir, resumed)


def test_commands_on_a_damaged_checkpoint_say_which_file_and_what_to_use(
    workdir, uninterrupted, capsys
):
    from asrkit.cli.main import main

    exp = workdir / "exp_broken"
    shutil.copytree(workdir / "exp_a", exp)
    checkpoints = CheckpointManager(exp / "checkpoints").checkpoints()
    (checkpoints[-1] / "ckpt.index").write_bytes(b"")
    capsys.readouterr()
    commands = {
        "decode": ["decode", "--exp-dir", str(exp), "--shards", str(workdir / "shards/dev")],
        "average": ["average", "--exp-dir", str(exp), "--last", "2"],
        "export": ["export", "--exp-dir", str(exp), "--out", str(workdir / "never")],
    }
    for command, argv in commands.items():
        started = time.monotonic()
        assert main(argv) == 2, command
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1, (command, err)
        assert err[0].startswith(f"asrkit {command}: error: damaged checkpoint: "), err
        assert f"{checkpoints[-1] / 'ckpt.index'}: 0 bytes" in err[0]
        assert f"pass --checkpoint {checkpoints[-2]}" in err[0]
        assert time.monotonic() - started < 30, command
    assert not (workdir / "never").exists()


def test_resuming_with_another_data_plan_is_refused_then_restarted_on_request(
    workdir, uninterrupted
):
    """A mid-epoch checkpoint counts micro-batches of its epoch's order: other micro-batch
    sizes (or shards, buckets, seed) would make that count point elsewhere."""
    exp = workdir / "exp_plan"
    shutil.copytree(workdir / "exp_a", exp)
    checkpoints = CheckpointManager(exp / "checkpoints").checkpoints()
    middle = next(c for c in checkpoints if json.loads((c / "state.json").read_text())[
        "micro_batches"] > 0)  # fmt: skip
    for later in checkpoints[checkpoints.index(middle) + 1 :]:
        shutil.rmtree(later)
    recorded = json.loads((middle / "state.json").read_text())
    assert recorded["data_plan"]["seed"] == 0 and recorded["data_plan"]["batch_sizes"]
    changed = load_config(workdir / "conf.yaml", ["data.batch_seconds=9", "train.seed=4"])
    cwd = os.getcwd()
    os.chdir(workdir)
    try:
        before = (exp / "config.yaml").read_text()
        with pytest.raises(DataPlanChanged) as refused:
            train(changed, exp, log=lambda *_: None)
        assert (exp / "config.yaml").read_text() == before  # the refused run recorded nothing
        lines = []
        result = train(changed, exp, log=lines.append, new_epoch_order=True)
    finally:
        os.chdir(cwd)
    message = str(refused.value)
    assert "micro-batch sizes (data.batch_seconds" in message and "train.seed" in message
    assert "--new-epoch-order" in message
    assert any(f"epoch {recorded['epoch'] + 1} starts again" in line for line in lines)
    # Weights, optimizer and update count carried on; the epoch ran whole in the new order.
    assert result.state.epoch == 3 and result.state.updates > recorded["updates"]
    final = json.loads((CheckpointManager(exp / "checkpoints").latest() / "state.json").read_text())
    assert final["data_plan"]["seed"] == 4


def test_a_resume_its_checkpoint_refuses_leaves_the_recorded_config(workdir, uninterrupted):
    """Another architecture than the checkpoints': refused (exit 2, one line naming the
    checkpoint) before config.yaml is rewritten, so the experiment still decodes as before."""
    from asrkit.cli.main import main

    exp = workdir / "exp_arch"
    shutil.copytree(workdir / "exp_a", exp)
    before = (exp / "config.yaml").read_text()
    cwd = os.getcwd()
    os.chdir(workdir)
    try:
        code = main(["train", "--config", "conf.yaml", "--exp-dir", str(exp),
                     "--set", "model.encoder.lstm_units=32"])  # fmt: skip
    finally:
        os.chdir(cwd)
    assert code == 2
    assert (exp / "config.yaml").read_text() == before
    assert "lstm_units: 24" in before


def test_train_without_a_config_continues_the_experiment_from_anywhere(
    workdir, uninterrupted, tmp_path, monkeypatch, capsys
):
    """`asrkit train --exp-dir EXP` (no --config) uses the config EXP recorded: from another
    directory, one more epoch on the same shards, tokenizer and model."""
    from asrkit.cli.main import main

    exp = tmp_path / "moved" / "exp"
    shutil.copytree(workdir / "exp_a", exp)
    monkeypatch.chdir(tmp_path)
    assert main(["train", "--exp-dir", "moved/exp", "--set", "train.epochs=4"]) == 0
    assert "4 epochs" in capsys.readouterr().out
    final = json.loads((CheckpointManager(exp / "checkpoints").latest() / "state.json").read_text())
    assert final["epoch"] == 4
    assert "epochs: 4" in (exp / "config.yaml").read_text()
    # An asset path given here is this directory's, not the experiment's: refused as missing.
    assert main(["train", "--exp-dir", "moved/exp", "--set", "data.cmvn=nowhere.json"]) == 2
    assert str(tmp_path / "nowhere.json") in capsys.readouterr().err


def _start_training(workdir, exp, **popen):
    """`asrkit train` on the module's config as a real process (so it can be signalled)."""
    cmd = [sys.executable, "-m", "asrkit.cli.main", "train", "--config", "conf.yaml",
           "--exp-dir", str(exp)]  # fmt: skip
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return cmd, env, subprocess.Popen(cmd, cwd=workdir, env=env, **popen)


def _wait_for_checkpoints(exp, count: int, seconds: float = 120) -> None:
    # Complete checkpoints only: a `ckpt-*.tmp` being written holds a state.json too.
    # (list_checkpoints only reads; a CheckpointManager would sweep the run's .tmp dirs.)
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if len(list_checkpoints(exp / "checkpoints")) >= count:
            return
        time.sleep(0.05)


def _assert_model_weights_close(got: dict, want: dict, rtol: float, atol: float) -> None:
    """Both checkpoints hold the same values; the network's weights agree to tolerance."""
    model_keys = [k for k in want if k.startswith("weights/")]
    assert model_keys and set(got) == set(want)
    for key in model_keys:
        np.testing.assert_allclose(got[key], want[key], rtol=rtol, atol=atol, err_msg=key)


def _assert_same_final_weights(exp_a, exp_b) -> None:
    a = _weights(CheckpointManager(exp_a / "checkpoints").latest())
    b = _weights(CheckpointManager(exp_b / "checkpoints").latest())
    assert a.keys() == b.keys()
    for name in a:
        np.testing.assert_array_equal(a[name], b[name], err_msg=name)


@pytest.mark.slow
def test_sigkill_at_any_moment_then_resume_ends_identical(workdir, uninterrupted):
    exp = workdir / "exp_kill"
    cmd, env, proc = _start_training(workdir, exp, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL)  # fmt: skip
    _wait_for_checkpoints(exp, 3)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert len(CheckpointManager(exp / "checkpoints").checkpoints()) >= 3
    subprocess.run(cmd, cwd=workdir, env=env, check=True, capture_output=True, timeout=300)
    _assert_same_final_weights(workdir / "exp_a", exp)


@pytest.mark.slow
def test_sigterm_finishes_the_window_checkpoints_and_resumes_identically(workdir, uninterrupted):
    exp = workdir / "exp_term"
    cmd, env, proc = _start_training(workdir, exp, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True)  # fmt: skip
    _wait_for_checkpoints(exp, 2)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err[-3000:]
    stopped = [line for line in out.splitlines() if line.startswith("stopped by SIGTERM")]
    assert len(stopped) == 1 and "rerun the same command to resume" in stopped[0], out
    assert "Traceback" not in err
    latest = CheckpointManager(exp / "checkpoints").latest()
    assert latest.name in stopped[0]
    final = CheckpointManager(workdir / "exp_a" / "checkpoints").latest()
    assert latest.name < final.name  # it really stopped early

    subprocess.run(cmd, cwd=workdir, env=env, check=True, capture_output=True, timeout=300)
    _assert_same_final_weights(workdir / "exp_a", exp)


def test_a_failing_save_stops_training_and_keeps_earlier_checkpoints(workdir, monkeypatch):
    import errno

    from asrkit import checkpoints
    from asrkit.checkpoints import CheckpointError, read_weights

    real_write, calls = checkpoints._write, []

    def disk_fills_up(*args, **kwargs):
        calls.append(1)
        if len(calls) >= 3:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        real_write(*args, **kwargs)

    monkeypatch.setattr(checkpoints, "_write", disk_fills_up)
    cwd = os.getcwd()
    os.chdir(workdir)
    try:
        config = load_config(workdir / "conf.yaml", ["data.dev_shards=null"])
        with pytest.raises(CheckpointError, match=r"No space left on device.*intact"):
            train(config, workdir / "exp_full", log=lambda *_: None)
    finally:
        os.chdir(cwd)
    kept = CheckpointManager(workdir / "exp_full" / "checkpoints").checkpoints()
    assert [p.name for p in kept] == ["ckpt-00000001", "ckpt-00000002"]
    assert all(read_weights(p) for p in kept)
    assert not list((workdir / "exp_full" / "checkpoints").glob("*.tmp"))


@pytest.mark.slow
def test_a_moved_experiment_works_from_any_directory(workdir, uninterrupted, tmp_path):
    """Everything an experiment needs lives inside it: after moving it, decode, average,
    transcribe, export and --init-from work from another working directory."""
    moved = tmp_path / "elsewhere" / "exp"
    shutil.copytree(workdir / "exp_a", moved)
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    asrkit = Path(sys.executable).parent / "asrkit"

    def run(*args, where=cwd):
        done = subprocess.run([asrkit, *map(str, args)], cwd=where, capture_output=True,
                              text=True, timeout=300)  # fmt: skip
        assert done.returncode == 0, done.stderr[-3000:]
        return done.stdout

    dev = workdir / "shards" / "dev"
    run("decode", "--exp-dir", moved, "--shards", dev, "--out", tmp_path / "moved")
    run("decode", "--exp-dir", "exp_a", "--shards", dev, "--out", tmp_path / "there",
        where=workdir)  # fmt: skip
    hyps = [(tmp_path / d / "hyp.txt").read_text() for d in ("moved", "there")]
    assert hyps[0] == hyps[1] and hyps[0].strip()
    assert "averaged" in run("average", "--exp-dir", moved, "--last", "2")
    audio = sorted((workdir / "corpus").rglob("*.flac"))[0]
    assert str(audio) in run("transcribe", "--exp-dir", moved, audio)
    run("export", "--exp-dir", moved, "--out", tmp_path / "export")
    out = run("train", "--config", workdir / "conf.yaml", "--exp-dir", tmp_path / "ft",
              "--init-from", moved, "--set", f"data.train_shards={workdir / 'shards/train'}",
              "--set", f"data.tokenizer={moved / 'tokenizer'}", "--set", "data.dev_shards=null",
              "--set", "train.epochs=1")  # fmt: skip
    assert "initialised 24 variables" in out, out


def test_a_retrained_tokenizer_cannot_silently_change_an_experiment(workdir, tmp_path):
    from asrkit.experiment import ExperimentError, adopt_assets

    shutil.copytree(workdir / "tokenizer", tmp_path / "tok")
    config = load_config(workdir / "conf.yaml", [f"data.tokenizer={tmp_path / 'tok'}"])
    recorded = adopt_assets(config, tmp_path / "exp")
    assert recorded.data.tokenizer == "tokenizer"
    assert (tmp_path / "exp" / "tokenizer" / "tokenizer.model").exists()
    adopt_assets(config, tmp_path / "exp")  # the same tokenizer again: a resume, fine
    texts = [u.text for u in read_manifest(workdir / "data" / "train-clean-100.jsonl")]
    train_tokenizer(texts * 3, tmp_path / "tok", 20, "char")  # retrained in place
    with pytest.raises(ExperimentError, match="differs from the tokenizer this experiment"):
        adopt_assets(config, tmp_path / "exp")


def test_a_run_refused_for_a_missing_asset_leaves_nothing_behind(workdir, tmp_path):
    """A config naming a CMVN file that is not there: the run stops naming it, and neither
    the experiment directory nor a copy of the tokenizer is left behind."""
    config = load_config(workdir / "conf.yaml", [f"data.cmvn={tmp_path / 'nowhere.json'}"])
    with pytest.raises(FileNotFoundError, match=r"data\.cmvn: .*nowhere\.json missing"):
        train(config, tmp_path / "exp", log=lambda *_: None)
    assert not (tmp_path / "exp").exists()


def _verify(workdir, *overrides, config="conf.yaml", floor=False):
    from asrkit.training.verify import verify_accumulation

    cwd = os.getcwd()
    os.chdir(workdir)
    try:
        config = load_config(workdir / config, list(overrides))
        return verify_accumulation(config, steps=3, floor=floor)
    finally:
        os.chdir(cwd)
        import keras

        keras.mixed_precision.set_dtype_policy("float32")


def test_the_pruned_loss_with_an_lstm_predictor_is_cautioned_against():
    pruned = ["loss.kind=pruned"]
    assert any("stateless" in c for c in config_cautions(load_config(None, pruned)))
    stateless = load_config(None, [*pruned, "model.predictor.kind=stateless"])
    assert config_cautions(stateless) == [] and config_cautions(load_config(None)) == []
    tdt = ["loss.kind=tdt", "model.durations=[0, 2, 4]"]
    assert any("has no 1" in c for c in config_cautions(load_config(None, tdt)))
    assert config_cautions(load_config(None, [tdt[0], "model.durations=[0, 1, 2]"])) == []


def test_verify_accumulation_passes_with_the_pruned_loss(workdir):
    report = _verify(workdir, "loss.kind=pruned", "loss.prune_range=3")
    assert report.passed and report.max_relative_difference < 1e-5


def test_verify_accumulation_passes_with_the_tdt_loss(workdir):
    """A TDT joint trained with the fused TDT loss and omega sampling (one draw per update:
    every micro-batch of a window takes the same loss)."""
    report = _verify(workdir, "model.durations=[0, 1, 2]", "loss.kind=tdt", "loss.sigma=0.05",
                     "loss.omega=0.5")  # fmt: skip
    assert report.passed and report.max_relative_difference < 1e-5


def test_verify_accumulation_passes_on_the_real_transducer_with_a_delay_penalty(workdir):
    """The real transducer's update from 3 micro-batches equals their union's, with a delay
    penalty: it is centred on each utterance's own frames, so micro-batches padded to
    different lengths still make their union's update."""
    report = _verify(workdir, "loss.delay_penalty=0.05")
    assert report.passed and report.max_relative_difference < 1e-5
    assert len(report.micro_batch_sizes) == 3


def test_verify_accumulation_switches_off_every_random_draw(workdir):
    """Attention dropout, pre-encoder dropout and stochastic depth (an imported NeMo
    model's) draw other numbers for a micro-batch than for its rows in the union: the check
    runs without them, and still passes at the float32 tolerance."""
    report = _verify(workdir, "model.encoder.attention_dropout=0.5",
                     "model.encoder.pre_encoder_dropout=0.5", "model.encoder.stochastic_depth=0.5",
                     config="conformer.yaml")  # fmt: skip
    assert report.passed and report.max_relative_difference < 1e-5


@pytest.mark.slow
def test_verify_accumulation_catches_batch_norm(workdir):
    # BatchNorm normalises each micro-batch with its own statistics: not the union's update.
    assert _verify(workdir, config="conformer.yaml").passed
    assert not _verify(workdir, "model.encoder.conv_norm=batch", config="conformer.yaml").passed
    batch = load_config(workdir / "conformer.yaml", ["model.encoder.conv_norm=batch"])
    assert any("not the update from their union" in c for c in config_cautions(batch))
    assert not config_cautions(load_config(workdir / "conformer.yaml"))


@pytest.mark.slow
def test_verify_accumulation_mixed_float16(workdir):
    report = _verify(workdir, "train.precision=mixed_float16")
    assert report.passed and report.attempts >= 2  # both sides really made their update
    assert 0 < report.norm_relative_difference < 1e-2


@pytest.mark.slow
def test_verify_accumulation_mixed_bfloat16_measures_its_rounding_floor(workdir):
    """With `floor`, in bfloat16 the check measures how far the union's update is from
    float32's and takes twice that, or the fixed 0.25, as its tolerance; float32 needs none."""
    report = _verify(workdir, "train.precision=mixed_bfloat16", floor=True)
    assert report.attempts == 3  # accumulated, union, float32 union: one window each
    assert 0 < report.floor_norm < 0.5 and report.floor_max > 0
    assert report.tolerance == max(0.25, 2 * report.floor_max)
    assert report.passed and report.norm_relative_difference < 0.5
    assert _verify(workdir, floor=True).floor_max is None  # float32: nothing to measure
    assert _verify(workdir, "train.precision=mixed_bfloat16").floor_max is None  # not asked


@pytest.mark.slow  # ~30-40 s: the longest of make test; the fine-tune loading is also tested fast
def test_fine_tune_with_a_new_vocabulary_and_a_frozen_encoder(workdir, uninterrupted):
    texts = [u.text for u in read_manifest(workdir / "data" / "train-clean-100.jsonl")]
    tok = train_tokenizer(texts * 3, workdir / "tokenizer2", 40, "unigram")
    write_shards(workdir / "data" / "train-clean-100.jsonl", tok, workdir / "shards2",
                 num_shards=2, show_progress=False)  # fmt: skip
    logs = []
    overrides = ["data.tokenizer=tokenizer2", "data.train_shards=shards2", "data.dev_shards=null",
                 "train.epochs=1", "train.freeze_encoder=-1"]  # fmt: skip
    cwd = os.getcwd()
    os.chdir(workdir)
    try:
        config = load_config(workdir / "conf.yaml", overrides)
        train(config, workdir / "exp_ft", init_from=str(workdir / "exp_a"), log=logs.append)
    finally:
        os.chdir(cwd)
    text = "\n".join(logs)
    # Only the vocabulary-sized variables were left at their fresh initialisation, by name.
    not_loaded = sorted(line.split(":")[1].strip() for line in logs
                        if line.startswith("  not loaded:"))  # fmt: skip
    assert not_loaded == ["joint.output_layer.bias", "joint.output_layer.kernel",
                          "predictor.embedding.embeddings"], text  # fmt: skip
    assert all("shape" in line for line in logs if line.startswith("  not loaded:"))
    assert not any("left fresh" in line or "not in this model" in line for line in logs), text
    # The frozen encoder is exactly the pretrained one.
    pre = _weights(CheckpointManager(workdir / "exp_a" / "checkpoints").latest())
    post = _weights(CheckpointManager(workdir / "exp_ft" / "checkpoints").latest())
    same = sorted(k for k in pre if k.startswith("weights/") and np.array_equal(pre[k], post[k]))
    # Unchanged: exactly the frozen encoder's 11 weights (3 conv/dense pairs, the LSTM's 3,
    # LayerNorm's 2) and the LSTM cells' RNG states (no recurrent dropout: never drawn);
    # everything else trained on, was re-initialised or drew dropout masks, so it differs.
    frozen = [k for k in pre if k.startswith("weights/encoder..") and "seed" not in k]
    unused = [k for k in pre if "cell..seed_generator" in k]
    assert len(frozen) == 11 and len(unused) == 2
    assert same == sorted(frozen + unused), set(same) ^ set(frozen + unused)


@pytest.mark.slow  # ~12 s each; the float16 update itself: test_verify_accumulation_mixed_float16
@pytest.mark.parametrize("precision", ["mixed_float16", "mixed_bfloat16"])
def test_mixed_precision_training_runs_and_stays_finite(workdir, precision):
    import keras

    cwd = os.getcwd()
    os.chdir(workdir)
    try:
        overrides = [f"train.precision={precision}", "train.epochs=2", "data.dev_shards=null"]
        result = train(
            load_config(workdir / "conf.yaml", overrides), workdir / f"exp_{precision}",
            log=lambda *_: None,
        )  # fmt: skip
    finally:
        os.chdir(cwd)
        keras.mixed_precision.set_dtype_policy("float32")
    assert len(result.epoch_losses) == 2 and np.all(np.isfinite(result.epoch_losses))
    assert result.state.updates > 0


@pytest.mark.slow
def test_jit_compile_under_mirrored_trains_like_without(workdir):
    """`train.jit_compile=true, train.strategy=mirrored` on 2 logical CPUs: one update per
    window as without XLA (dropout off, same data): the same weights to float tolerance."""
    cwd = os.getcwd()
    os.chdir(workdir)
    common = ["train.epochs=1", "data.dev_shards=null", "train.strategy=mirrored",
              "model.encoder.dropout=0", "model.predictor.dropout=0", "data.spec_augment=false",
              "train.checkpoint_every=0", "train.probe_memory=false"]  # fmt: skip
    lines = []
    try:
        results = {}
        for jit in ("false", "true"):
            config = load_config(workdir / "conf.yaml", [*common, f"train.jit_compile={jit}"])
            results[jit] = train(config, workdir / f"exp_jit_{jit}", log=lines.append)
    finally:
        os.chdir(cwd)
    assert sum("x 2 replica(s)" in line for line in lines) == 2, lines
    assert results["true"].state.updates == results["false"].state.updates > 0
    (plain,) = CheckpointManager(workdir / "exp_jit_false" / "checkpoints").checkpoints()
    (jit,) = CheckpointManager(workdir / "exp_jit_true" / "checkpoints").checkpoints()
    # XLA fuses and reorders float32 arithmetic: a few ulps per gradient. Adam divides by
    # sqrt(v), so a weight whose gradient is near zero can drift by more than its own size
    # (1.1e-5 on a weight of 4e-4 was seen). One Adam step at lr 3e-3 moves a weight by up to
    # 3e-3: atol 1e-4 still fails on a missed, doubled or per-micro-batch update.
    _assert_model_weights_close(_weights(jit), _weights(plain), rtol=1e-4, atol=1e-4)


@pytest.mark.slow
def test_two_worker_training_equals_one_process_with_the_same_global_batches(workdir, tmp_path):
    """`asrkit train` as 2 MultiWorkerMirrored processes on loopback: each global micro-batch
    holds data.batch_seconds per replica and is split between the workers. One process with
    twice the micro-batch reads the same global micro-batches, so (dropout off) both must end
    with the same weights; only the chief keeps checkpoints, logs and TensorBoard."""
    from tests.training.test_multi_worker import run_workers

    asrkit = Path(sys.executable).parent / "asrkit"
    common = ["--config", "conf.yaml", "--set", "train.epochs=1", "--set", "data.dev_shards=",
              "--set", "model.encoder.dropout=0", "--set", "model.predictor.dropout=0",
              "--set", "train.checkpoint_every=0"]  # fmt: skip
    single = subprocess.run(
        [asrkit, "train", *common, "--exp-dir", str(tmp_path / "single"),
         "--set", "data.batch_seconds=12.0"],
        cwd=workdir, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert single.returncode == 0, single.stderr[-3000:]

    outputs = run_workers(
        [asrkit, "train", *common, "--exp-dir", str(tmp_path / "multi"),
         "--set", "train.strategy=multiworker"],
        cwd=workdir,
    )  # fmt: skip
    assert "x 2 replica(s)" in outputs[0] and "model:" not in outputs[1]  # chief logs
    assert not list((tmp_path / "multi").glob(".worker-*"))  # scratch removed
    (multi,) = CheckpointManager(tmp_path / "multi" / "checkpoints").checkpoints()
    (alone,) = CheckpointManager(tmp_path / "single" / "checkpoints").checkpoints()
    got, want = _weights(multi), _weights(alone)
    _assert_model_weights_close(got, want, rtol=1e-3, atol=1e-5)
    iterations = "optimizer/_iterations/.ATTRIBUTES/VARIABLE_VALUE"
    assert int(got[iterations]) == int(want[iterations]) > 0


@pytest.mark.slow  # ~11 s; the CTC loss itself is tested in tests/losses/test_ctc.py
@pytest.mark.parametrize("interpolate", [False, True])
def test_verify_accumulation_passes_with_an_auxiliary_ctc_loss(workdir, interpolate):
    report = _verify(workdir, "model.ctc_head=true", "loss.ctc_weight=0.5",
                     f"loss.ctc_interpolate={str(interpolate).lower()}")  # fmt: skip
    assert report.passed and report.max_relative_difference < 1e-5


@pytest.mark.parametrize("strategy", ["auto", "mirrored"])
def test_verify_accumulation_passes_with_the_ctc_loss_divided_by_another_count(workdir, strategy):
    """NeMo's hybrids divide the transducer loss by the window's tokens and the CTC loss by
    its utterances: 3 micro-batches (on 2 replicas too) still make their union's update —
    each micro-step weighs its CTC sum by the whole window's tokens over its utterances,
    totalled before the first backward pass (one micro-batch's own counts would make
    another update: their ratio differs from micro-batch to micro-batch). NeMo's own
    gradient of such a loss: tests/importers/test_nemo_training.py."""
    mixed = ["model.ctc_head=true", "loss.ctc_weight=0.5", "loss.ctc_interpolate=true",
             f"train.strategy={strategy}"]  # fmt: skip
    report = _verify(workdir, *mixed, "loss.ctc_normalize_by=utterances")
    assert report.passed and report.max_relative_difference < 1e-5, report


@pytest.mark.slow
@pytest.mark.parametrize(
    "chunks",
    [
        "model.encoder.left_chunks=1",
        "model.encoder.dynamic_chunks=5",
        "model.encoder.subsampling=dw_striding model.encoder.subsampling_factor=8 "
        "model.encoder.causal_subsampling=true model.encoder.conv_context=causal "
        "model.encoder.left_chunks=2 model.encoder.lookaheads=[3,1,0]",
    ],
)
def test_verify_accumulation_passes_with_a_chunked_conformer(workdir, chunks):
    """Fixed chunks (1 back), dynamic chunks (drawn per update, so the micro-batches of a
    window and their union use the same; with at most 5 frames the one update that verify
    makes draws 4-frame chunks, not full context), and several look-aheads as NeMo's
    cache-aware models train (drawn per update too; the one update draws look-ahead 0,
    not the default 3)."""
    from asrkit.models.conformer import dynamic_chunk_frames, lookahead_chunk_frames

    assert int(dynamic_chunk_frames(0, 5)) == 4
    assert int(lookahead_chunk_frames(0, (3, 1, 0))) != 4
    report = _verify(workdir, "model.encoder.chunk_frames=4", *chunks.split(),
                     config="conformer.yaml")  # fmt: skip
    assert report.passed and report.max_relative_difference < 1e-5


def test_too_little_disk_for_checkpoints_fails_before_the_first_update(
    workdir, monkeypatch, capsys
):
    """Room for two checkpoints (weights and optimizer slots) is checked once the model is
    built, before any update: one line naming the directory and the sizes, exit 2."""
    import shutil as shutil_module
    from collections import namedtuple

    from asrkit.cli.main import main

    usage = namedtuple("usage", "total used free")
    real = shutil_module.disk_usage
    monkeypatch.setattr(
        "asrkit.outputs.shutil.disk_usage",
        lambda p: usage(10**9, 10**9 - 1024, 1024) if "exp_no_room" in str(p) else real(p),
    )
    monkeypatch.chdir(workdir)
    capsys.readouterr()
    exp = workdir / "exp_no_room"
    assert main(["train", "--config", str(workdir / "conf.yaml"), "--exp-dir", str(exp)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"--exp-dir {exp}/checkpoints: 1.00 KiB free, about" in err[0], err
    assert not list(exp.glob("checkpoints/ckpt-*"))


# --- two workers (`asrkit train --workers`): a worker lost, the chief killed mid-save ------

TWO_WORKERS = ["--config", "conf.yaml", "--set", "train.epochs=3"]


@pytest.fixture(scope="module")
def two_workers_uninterrupted(workdir):
    from tests.training.test_multi_worker import finish, start_workers

    exp = workdir / "exp_two"
    results = finish(start_workers([*TWO_WORKERS, "--exp-dir", str(exp)], workdir))
    assert all(code == 0 for code, _, _ in results), results[0][2][-3000:]
    return exp


def _lost_worker_line(err: str) -> str:
    lines = [line for line in err.splitlines() if line.strip()]
    assert "Traceback" not in err and len(lines) == 1, err[-3000:]
    return lines[0]


@pytest.mark.slow
def test_a_worker_killed_mid_window_stops_the_other_then_a_rerun_ends_identical(
    workdir, two_workers_uninterrupted
):
    """SIGKILL to worker 1 at a random moment (the tiny model spends most of its time in
    windows): the chief ends within a bounded time with one line naming worker 1 and the
    checkpoint to resume from, exit 3; the same command again finishes the job with weights
    bit-identical to an uninterrupted two-worker run."""
    from tests.training.test_multi_worker import finish, start_workers

    exp = workdir / "exp_lost_worker"
    args = [*TWO_WORKERS, "--exp-dir", str(exp)]
    procs = start_workers(args, workdir)
    _wait_for_checkpoints(exp, 3)
    procs[1].kill()
    killed = time.monotonic()
    ((code, _, err),) = finish(procs[:1], timeout=120)
    took = time.monotonic() - killed
    procs[1].wait()
    line = _lost_worker_line(err)
    assert code == 3 and took < 60, (code, took, line)
    latest = CheckpointManager(exp / "checkpoints").latest()
    assert "worker 1 (127.0.0.1:" in line and "stopped answering" in line
    assert f"the last complete checkpoint is {latest.name}" in line

    results = finish(start_workers(args, workdir))
    assert [code for code, _, _ in results] == [0, 0], results[0][2][-3000:]
    assert f"resumed from {latest.name}" in results[0][1]
    _assert_same_final_weights(two_workers_uninterrupted, exp)


@pytest.mark.slow
def test_the_chief_killed_while_writing_a_checkpoint_resumes_from_the_one_before(
    workdir, two_workers_uninterrupted
):
    """SIGKILL to the chief while a checkpoint is half-written (its `.tmp` directory there):
    the checkpoints before it stay intact, the other worker ends with exit 3 naming the
    chief, and the rerun resumes from the last complete one and ends bit-identical."""
    from tests.training.test_multi_worker import finish, start_workers

    exp = workdir / "exp_chief_killed"
    args = [*TWO_WORKERS, "--exp-dir", str(exp)]
    for _attempt in range(5):  # until the kill lands inside a save
        shutil.rmtree(exp, ignore_errors=True)
        procs = start_workers(args, workdir)
        half = _first_half_written_checkpoint(exp, procs[0])
        if half is not None:
            procs[0].kill()
            procs[0].wait()
            if half.exists():
                break
        finish(procs, timeout=120)
    else:
        pytest.fail("no kill landed while a checkpoint was being written")
    ((code, _, err),) = finish(procs[1:], timeout=120)
    line = _lost_worker_line(err)
    assert code == 3 and "worker 0 (127.0.0.1:" in line, line
    complete = CheckpointManager(exp / "checkpoints").checkpoints()
    # (at an epoch's end the checkpoint of its last window is written again, with the
    # epoch counted: the kill can land in that rewrite, which keeps the first version)
    assert complete and complete[-1].name <= half.name.removesuffix(".tmp")
    assert all(checkpoint_damage(c) is None for c in complete)

    results = finish(start_workers(args, workdir))
    assert [code for code, _, _ in results] == [0, 0], results[0][2][-3000:]
    assert f"resumed from {complete[-1].name}" in results[0][1]
    _assert_same_final_weights(two_workers_uninterrupted, exp)


def _first_half_written_checkpoint(exp: Path, proc, seconds: float = 120) -> Path | None:
    """The first `ckpt-*.tmp` directory seen after two complete checkpoints (polled every
    millisecond), or None if the run ended first."""
    deadline = time.monotonic() + seconds
    checkpoints = exp / "checkpoints"
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            names = os.listdir(checkpoints)
        except FileNotFoundError:
            names = []
        complete = sum(1 for n in names if n.startswith("ckpt-") and "." not in n)
        half = [n for n in names if n.endswith(".tmp")]
        if complete >= 2 and half:
            return checkpoints / half[0]
        time.sleep(0.001)
    return None


@pytest.mark.slow
def test_sigterm_to_one_worker_stops_both_at_one_window_and_resumes_identically(
    workdir, two_workers_uninterrupted
):
    """A preempted machine: SIGTERM to worker 1 only. Both stop after the same window (the
    workers agree at every window boundary), the chief writes the checkpoint, both exit 0;
    the same command again ends bit-identical to the uninterrupted run."""
    from tests.training.test_multi_worker import finish, start_workers

    exp = workdir / "exp_term_one"
    args = [*TWO_WORKERS, "--exp-dir", str(exp)]
    procs = start_workers(args, workdir)
    _wait_for_checkpoints(exp, 2)
    procs[1].send_signal(signal.SIGTERM)
    results = finish(procs, timeout=120)
    assert [code for code, _, _ in results] == [0, 0], results[0][2][-3000:]
    stopped = [line for line in results[0][1].splitlines() if line.startswith("stopped by")]
    assert len(stopped) == 1 and "a signal to another worker" in stopped[0], results[0][1]
    latest = CheckpointManager(exp / "checkpoints").latest()
    assert latest.name in stopped[0]
    assert latest.name < CheckpointManager(two_workers_uninterrupted / "checkpoints").latest().name

    results = finish(start_workers(args, workdir))
    assert [code for code, _, _ in results] == [0, 0], results[0][2][-3000:]
    _assert_same_final_weights(two_workers_uninterrupted, exp)


def test_decode_and_transcribe_boost_a_phrase_list(workdir, uninterrupted, tmp_path):
    """`--boost` reaches the search from both commands: a phrase boosted far past the model's
    own odds is in every hypothesis; weight 0 gives the unboosted hypotheses."""
    from asrkit.cli.main import main

    exp, dev = workdir / "exp_a", workdir / "shards" / "dev"
    phrases = tmp_path / "phrases.txt"
    phrases.write_text("tarot\n")

    def decode(name, *extra):
        argv = ["decode", "--exp-dir", str(exp), "--shards", str(dev), "--out",
                str(tmp_path / name), *extra]  # fmt: skip
        assert main(argv) == 0
        return [line.split(" ", 1)[1:] for line in (tmp_path / name / "hyp.txt").open()]

    plain = decode("plain")
    assert decode("zero", "--boost", str(phrases), "--boost-weight", "0") == plain
    boosted = decode("boosted", "--boost", str(phrases), "--boost-weight", "30")
    assert boosted != plain and all("TAROT" in hyp[0] for hyp in boosted), boosted
    audio = sorted((workdir / "corpus").rglob("*.flac"))[0]
    out = tmp_path / "t"
    assert main(["transcribe", "--exp-dir", str(exp), "--boost", str(phrases),
                 "--boost-weight", "30", "--out-dir", str(out), str(audio)]) == 0  # fmt: skip
    assert "TAROT" in (out / f"{audio.stem}.txt").read_text()
    streamed = tmp_path / "s"
    assert main(["transcribe", "--exp-dir", str(exp), "--streaming", "--boost", str(phrases),
                 "--boost-weight", "30", "--out-dir", str(streamed), str(audio)]) == 0  # fmt: skip
    assert "TAROT" in (streamed / f"{audio.stem}.txt").read_text()  # (the file: in windows)


def test_lm_train_and_decode_with_an_lm(workdir, uninterrupted, tmp_path):
    """`asrkit lm train` writes the Kneser-Ney LM of the transcripts' pieces; `decode --lm`
    searches with exactly that LM's tables at the weight asked (weight 0: the plain
    hypotheses), beside LODR; `transcribe --lm` does too."""
    from asrkit.cli.main import main
    from asrkit.decoding.fusion.lm import lm_automaton
    from asrkit.decoding.fusion.tables import combine
    from asrkit.decoding.search.front import DecodeOptions
    from asrkit.experiment import load_experiment
    from asrkit.ngram import estimate, read_arpa

    exp, dev = workdir / "exp_a", workdir / "shards" / "dev"
    manifest = workdir / "data" / "train-clean-100.jsonl"
    arpa, low = tmp_path / "lm.arpa", tmp_path / "low.arpa"
    assert main(["lm", "train", "--tokenizer", str(exp), "--manifest", str(manifest),
                 "--out", str(arpa)]) == 0  # fmt: skip
    assert main(["lm", "train", "--tokenizer", str(exp / "tokenizer"), "--manifest",
                 str(manifest), "--order", "1", "--out", str(low)]) == 0  # fmt: skip
    loaded = load_experiment(exp)
    tokenizer = loaded.tokenizer
    from asrkit.data.manifest import read_manifest

    texts = [u.text for u in read_manifest(manifest)]
    pieces = [tokenizer.piece(i) for i in range(tokenizer.vocab_size)]
    want = estimate([[pieces[i] for i in tokenizer.encode(t)] for t in texts], 3, pieces[1:])
    lm = read_arpa(arpa)
    assert lm.probs.keys() == want.probs.keys()
    assert all(abs(lm.probs[g] - v) < 1e-5 for g, v in want.probs.items())

    def decode(name, *extra):
        argv = ["decode", "--exp-dir", str(exp), "--shards", str(dev), "--out",
                str(tmp_path / name), "--method", "beam", "--beam", "3", *extra]  # fmt: skip
        assert main(argv) == 0
        return [line.split(" ", 1)[1:] for line in (tmp_path / name / "hyp.txt").open()]

    plain = decode("plain")
    assert decode("zero", "--lm", str(arpa), "--lm-weight", "0") == plain
    fused = decode("fused", "--lm", str(arpa), "--lm-weight", "2", "--lodr", str(low),
                   "--lodr-weight", "0.5")  # fmt: skip
    # the results say what produced them: the LMs and the weights used
    recorded = json.loads((tmp_path / "fused" / "wer.json").read_text())
    assert (recorded["lm"], recorded["lm_weight"]) == (str(arpa), 2.0)
    assert (recorded["lodr"], recorded["lodr_weight"]) == (str(low), 0.5)
    assert "lm" not in json.loads((tmp_path / "plain" / "wer.json").read_text())
    assert f"LM {arpa} (weight 2) - LODR {low} (weight 0.5)" in (
        (tmp_path / "fused" / "report.txt").read_text()
    )
    tables = combine(lm_automaton(lm, pieces, 2.0), lm_automaton(read_arpa(low), pieces, -0.5))
    from asrkit.data.pipeline import pipeline_config
    from asrkit.decoding.recogniser import Recogniser
    from asrkit.decoding.runner import decode_shards

    recogniser = Recogniser.of(loaded, DecodeOptions("beam", 3, 3))
    report = decode_shards(recogniser, dev, tokenizer, pipeline_config(loaded.config), "basic",
                           tables)  # fmt: skip
    assert sorted(u.hypothesis for u in report.utterances) == sorted(h[0].strip() for h in fused)
    # The LM moved the search (the three-epoch model may emit nothing on some CPUs' numerics:
    # then there is nothing for it to move).
    assert fused != plain or not any(h[0].strip() for h in plain)
    audio = sorted((workdir / "corpus").rglob("*.flac"))[0]
    out = tmp_path / "t"
    assert main(["transcribe", "--exp-dir", str(exp), "--lm", str(arpa), "--lm-weight", "2",
                 "--out-dir", str(out), str(audio)]) == 0  # fmt: skip
    from asrkit.decoding.transcribe import NetworkRecogniser, transcribe_files

    recogniser = NetworkRecogniser.of(loaded, boost=combine(lm_automaton(lm, pieces, 2.0)))
    [want_text] = [t.text for t in transcribe_files(recogniser, [audio])]
    assert (out / f"{audio.stem}.txt").read_text().split("\t")[-1].strip() == want_text


def test_lm_train_refuses_text_the_tokenizer_cannot_encode(workdir, tmp_path, capsys):
    """Characters outside the tokenizer's alphabet would be <unk> in the LM: refused naming
    the file, line and characters, nothing written; --allow-unknown trains with a warning."""
    from asrkit.cli.main import main
    from asrkit.tokenizer import Tokenizer

    tokenizer = Tokenizer.load(workdir / "tokenizer")
    text = tmp_path / "text.txt"
    text.write_text("the red house\n\nthe caf\u00e9 \u00e9t\u00e9\n")
    assert tokenizer.unknown("the caf\u00e9 \u00e9t\u00e9") and not tokenizer.unknown("the red")
    arpa = tmp_path / "lm.arpa"
    argv = ["lm", "train", "--tokenizer", str(workdir / "tokenizer"), "--text", str(text),
            "--out", str(arpa)]  # fmt: skip
    capsys.readouterr()
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "1 line(s) hold characters the tokenizer cannot" in err[0]
    assert "text.txt:3" in err[0] and "--allow-unknown" in err[0], err
    assert not arpa.exists()
    with pytest.warns(UserWarning, match="the LM learns <unk> where they stand"):
        assert main([*argv, "--allow-unknown"]) == 0
    assert arpa.is_file()


def test_lm_train_warns_of_an_lm_too_big_for_a_search(workdir, tmp_path, monkeypatch, capsys):
    """The contexts `lm train` reports against the table limit are the states `--lm` would
    build: over the limit, a warning at training time and the same LM refused by `--lm`."""
    import asrkit.decoding.fusion.lm as lm_fusion
    import asrkit.decoding.fusion.tables as fusion
    from asrkit.cli.main import main
    from asrkit.errors import InputError
    from asrkit.ngram import read_arpa
    from asrkit.tokenizer import Tokenizer

    tokenizer = Tokenizer.load(workdir / "tokenizer")
    pieces = [tokenizer.piece(i) for i in range(tokenizer.vocab_size)]
    arpa = tmp_path / "lm.arpa"
    argv = ["lm", "train", "--tokenizer", str(workdir / "tokenizer"), "--manifest",
            str(workdir / "data" / "train-clean-100.jsonl"), "--out", str(arpa)]  # fmt: skip
    assert main(argv) == 0
    lm = read_arpa(arpa)
    states = len(lm_fusion.lm_automaton(lm, pieces, 1.0).final)
    assert states == len(lm_fusion.lm_contexts(lm))
    for module in (fusion, lm_fusion):
        monkeypatch.setattr(module, "MAX_TABLE_ENTRIES", states * len(pieces) - 1)
    capsys.readouterr()
    with pytest.warns(UserWarning, match=f"{states} contexts x {len(pieces)} pieces exceed"):
        assert main(argv) == 0, capsys.readouterr().err  # over the file it wrote before
    with pytest.raises(InputError, match="use a lower order or a pruned LM"):
        lm_fusion.lm_automaton(lm, pieces, 1.0)


@pytest.mark.parametrize("sets", [
    (), ("model.adapters.targets=[attention, feed_forward, convolution, joint]",),
    ("train.precision=mixed_bfloat16",),
])  # fmt: skip
def test_verify_accumulation_passes_with_lora(workdir, sets):
    """LoRA factors trained, everything else frozen: 3 micro-batches make their union's
    update (both networks share the frozen base, copied by name)."""
    report = _verify(workdir, "model.adapters.kind=lora", "model.adapters.rank=2", *sets,
                     config="conformer.yaml")  # fmt: skip
    assert report.passed, report
    if not sets or "precision" not in sets[0]:
        assert report.max_relative_difference < 1e-5


def test_a_lora_run_keeps_its_base_and_decodes_merged(workdir):
    """Fine-tuning through LoRA from a base experiment: the base's weights are saved
    unchanged, only the factors move; decoding's network holds each kernel plus
    (alpha / rank) A B (NumPy), and `asrkit average` writes the average of the merged
    networks."""
    from asrkit.checkpoints import average_last, list_checkpoints, read_weights
    from asrkit.experiment import adapted_weights, load_experiment, load_experiment_config

    cwd = os.getcwd()
    os.chdir(workdir)
    try:
        one_epoch = ["train.epochs=1", "train.checkpoint_every=0"]
        base = load_config(workdir / "conformer.yaml", one_epoch)
        train(base, workdir / "lora_base", log=lambda *_: None)
        lora = load_config(workdir / "conformer.yaml", [
            *one_epoch, "train.epochs=2", "model.adapters.kind=lora", "model.adapters.rank=2",
            "train.learning_rate=0.05"])  # fmt: skip
        lines = []
        train(lora, workdir / "lora_run", init_from=str(workdir / "lora_base"), log=lines.append)
    finally:
        os.chdir(cwd)
    assert any("not in the checkpoint, left fresh" in line for line in lines)
    before = read_weights(list_checkpoints(workdir / "lora_base/checkpoints")[-1])
    found = list_checkpoints(workdir / "lora_run/checkpoints")
    after = read_weights(found[-1])
    factors = {k for k in after if k.endswith(("lora_kernel_a", "lora_kernel_b"))}
    assert len(factors) == 2 * 6  # one block: qkv, out and the feed-forwards' 4 linears
    for name, value in before.items():
        if np.issubdtype(value.dtype, np.floating):  # every weight of the base, unchanged
            np.testing.assert_array_equal(after[name], value, err_msg=name)
    assert any(np.abs(after[k]).max() > 0 for k in factors if k.endswith("lora_kernel_b"))
    config = load_experiment_config(workdir / "lora_run")
    scale = 16.0 / 2
    experiment = load_experiment(workdir / "lora_run")
    named = {k: v.numpy() for k, v in named_variables(experiment.network).items()}
    assert not any("lora" in k for k in named)
    qkv = "encoder.blocks.0.attention.qkv."
    expected = (
        after[qkv + "kernel"] + scale * after[qkv + "lora_kernel_a"] @ after[qkv + "lora_kernel_b"]
    )
    np.testing.assert_allclose(named[qkv + "kernel"], expected, rtol=1e-6, atol=1e-7)
    averaged = average_last(workdir / "lora_run", 2, prepare=adapted_weights(config))
    mean = read_weights(averaged.path)
    first = read_weights(found[-2])
    assert not any("lora" in k for k in mean)
    np.testing.assert_allclose(
        mean[qkv + "kernel"],
        (expected + first[qkv + "kernel"] + scale * first[qkv + "lora_kernel_a"]
         @ first[qkv + "lora_kernel_b"]) / 2, rtol=1e-5, atol=1e-6)  # fmt: skip


def test_an_adapted_runs_checkpoints_hold_the_adapters_and_name_their_base(workdir, tmp_path):
    """Linear adapters trained from a base experiment: each checkpoint holds what the run
    trains (plus moving state) and `base.json`, never a frozen weight; every reader gets the
    whole network back, the frozen weights exactly the base's; a run resumed mid-way ends as
    the uninterrupted one; averaging keeps the base; a moved tree still finds its base, and
    a base gone or changed is named."""
    from asrkit.checkpoints import (
        CheckpointError,
        average_last,
        checkpoint_base,
        list_checkpoints,
        read_weights,
    )  # fmt: skip

    one_epoch = ["train.epochs=1", "train.checkpoint_every=0"]
    adapted = ["train.epochs=2", "model.adapters.kind=linear", "model.adapters.dim=4",
               "train.learning_rate=0.05"]  # fmt: skip
    cwd = os.getcwd()
    os.chdir(workdir)
    try:
        train(load_config("conformer.yaml", one_epoch), "ad_base", log=lambda *_: None)
        train(load_config("conformer.yaml", adapted), "ad_run", init_from="ad_base",
              log=lambda *_: None)  # fmt: skip
        found = list_checkpoints(workdir / "ad_run/checkpoints")
        shutil.copytree(workdir / "ad_run", workdir / "ad_resumed")
        for later in found[len(found) // 2 + 1 :]:
            shutil.rmtree(workdir / "ad_resumed/checkpoints" / later.name)
        lines = []
        train(load_config("conformer.yaml", adapted), "ad_resumed", init_from="ad_base",
              log=lines.append)  # fmt: skip
    finally:
        os.chdir(cwd)
    assert any(line.startswith("resumed from") for line in lines)
    base_dir = list_checkpoints(workdir / "ad_base/checkpoints")[-1]
    base = read_weights(base_dir)
    ref = checkpoint_base(found[-1])
    assert ref is not None and ref.path == str(base_dir.resolve())
    own = {k.split("/.ATTRIBUTES")[0].removeprefix("weights/").replace("..", ".")
           for k in _weights(found[-1]) if k.startswith("weights/")}  # fmt: skip
    adapter = {k for k in read_weights(found[-1]) if ".adapter." in k}
    assert adapter and adapter <= own
    frozen = {k for k, v in base.items()
              if np.issubdtype(v.dtype, np.floating) and "moving" not in k}  # fmt: skip
    assert set(ref.names) == frozen and not own & frozen  # no frozen weight is held twice
    whole = read_weights(found[-1])
    for name in frozen:
        np.testing.assert_array_equal(whole[name], base[name], err_msg=name)
    assert any(np.abs(whole[k]).max() > 0 for k in adapter if k.endswith("up.kernel"))
    _assert_same_final_weights(workdir / "ad_run", workdir / "ad_resumed")

    averaged = average_last(workdir / "ad_run", 2)
    assert checkpoint_base(averaged.path) == ref
    mean = read_weights(averaged.path)
    last, before = whole, read_weights(found[-2])
    for name in adapter:
        np.testing.assert_allclose(mean[name], (last[name] + before[name]) / 2, rtol=1e-6)

    moved = tmp_path / "moved"  # the base and the run moved together: found beside
    shutil.copytree(workdir / "ad_base", moved / "ad_base")
    shutil.copytree(workdir / "ad_run", moved / "ad_run")
    shutil.move(workdir / "ad_base", workdir / "ad_base.away")
    try:
        ckpt = moved / "ad_run/checkpoints" / found[-1].name
        np.testing.assert_array_equal(read_weights(ckpt)[sorted(frozen)[0]],
                                      base[sorted(frozen)[0]])  # fmt: skip
        with pytest.raises(CheckpointError, match=r"its base's .*ad_base.*which is gone"):
            read_weights(found[-1])
        other = moved / "ad_base/checkpoints" / base_dir.name
        (other / "files.json").write_text((other / "files.json").read_text() + " ")
        with pytest.raises(CheckpointError, match=r"is another checkpoint now"):
            read_weights(ckpt)
    finally:
        shutil.move(workdir / "ad_base.away", workdir / "ad_base")


def test_verify_accumulation_passes_with_lora_and_weights_trained_in_full(workdir):
    """A new vocabulary's rows (the joint's output layer, the predictor's embedding) train
    in full beside the factors: still the union's update."""
    report = _verify(workdir, "model.adapters.kind=lora", "model.adapters.rank=2",
                     "train.trainable=[joint.output_layer, predictor.embedding]",
                     config="conformer.yaml")  # fmt: skip
    assert report.passed and report.max_relative_difference < 1e-5


def test_verify_accumulation_passes_with_linear_adapters(workdir):
    """Only the adapters train; their first update is the output layer's alone (the rest
    of an adapter gets no gradient through a zero layer), summed over every frame: float
    rounding of 1.3e-5 relative here, a wrong normalisation would be O(1)."""
    report = _verify(workdir, "model.adapters.kind=linear", "model.adapters.dim=4",
                     config="conformer.yaml")  # fmt: skip
    assert report.passed and report.max_relative_difference < 5e-5
