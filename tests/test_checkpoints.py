"""Checkpoint I/O: named variables, complete-then-swap writes, averaging, fine-tune loading."""

import errno
import hashlib
import json
import os

import keras
import numpy as np
import pytest
import tensorflow as tf

from asrkit.checkpoints import (
    CheckpointError,
    CheckpointManager,
    TrainState,
    _record_files,
    average_best,
    average_last,
    best_checkpoints,
    list_checkpoints,
    load_matching_weights,
    named_variables,
    newest_intact,
    read_weights,
    restore,
)
from asrkit.config import EncoderConfig, ModelConfig
from asrkit.models.transducer import Transducer
from tests.tiny import tiny_model_config


def built_transducer(config=None, vocab=9):
    network = Transducer(vocab, config or tiny_model_config(units=8, dropout=0.1))
    network.build_from_features(80)
    return network


def is_float(var) -> bool:
    return np.issubdtype(np.dtype(var.dtype), np.floating)


def randomize(model, rng, scale=1.0):
    for var in model.variables:
        if is_float(var):
            var.assign(rng.standard_normal(var.shape).astype(np.float32) * scale)
        else:
            var.assign(np.full(var.shape, int(scale), np.dtype(var.dtype)))
    return {k: v.numpy().copy() for k, v in named_variables(model).items()}


def test_average_last_n(tmp_path):
    keras.utils.set_random_seed(0)
    model = built_transducer()
    assert any(not is_float(v) for v in model.variables)  # dropout RNG states
    manager = CheckpointManager(tmp_path / "checkpoints", keep=5)
    rng = np.random.default_rng(0)
    saved = []
    for updates in (10, 20, 30):
        saved.append(randomize(model, rng, updates))
        manager.save(model, TrainState(epoch=updates // 10, micro_batches=0, updates=updates))

    averaged = average_last(tmp_path, last=2)
    assert [p.name for p in averaged.sources] == [p.name for p in manager.checkpoints()[-2:]]
    assert not list_checkpoints(averaged.path.parent)  # apart from the training checkpoints

    fresh = built_transducer()
    state = restore(fresh, averaged.path)
    assert state.updates == 30
    for name, var in named_variables(fresh).items():
        got = var.numpy()
        if is_float(var):
            want = (saved[1][name].astype(np.float64) + saved[2][name].astype(np.float64)) / 2
            assert got.dtype == saved[2][name].dtype
            np.testing.assert_allclose(got, want.astype(got.dtype), rtol=0, atol=0)
        else:
            np.testing.assert_array_equal(got, saved[2][name])


def test_averaging_more_than_kept_is_a_clear_error(tmp_path):
    model = built_transducer()
    manager = CheckpointManager(tmp_path / "checkpoints", keep=2)
    for updates in (1, 2, 3):
        manager.save(model, TrainState(0, 0, updates))
    with pytest.raises(CheckpointError, match=r"2 checkpoint.*last 3.*keep_checkpoints"):
        average_last(tmp_path, last=3)


def test_the_best_by_dev_wer_are_kept_besides_the_newest_and_averaged(tmp_path):
    """keep 1 + keep_best 2 over epoch-end checkpoints with dev WERs 0.5, 0.3, 0.4, 0.6
    and mid-epoch ones without: the newest and the two best stay (every mid-epoch one but
    the newest goes); `average_best` averages exactly those two, a brute-force ranking of
    every saved state agrees, and asking for more than have a dev WER is a clear error."""
    keras.utils.set_random_seed(0)
    model = built_transducer()
    manager = CheckpointManager(tmp_path / "checkpoints", keep=1, keep_best=2)
    rng = np.random.default_rng(1)
    saved, wers = {}, {}
    for updates, wer in [(10, 0.5), (15, None), (20, 0.3), (30, 0.4), (35, None), (40, 0.6)]:
        saved[updates] = randomize(model, rng, updates)
        wers[updates] = wer
        manager.save(model, TrainState(updates // 10, 0, updates, dev_wer=wer))
    kept = {int(p.name.split("-")[1]) for p in manager.checkpoints()}
    ranked = sorted((w, u) for u, w in wers.items() if w is not None)
    assert kept == {40} | {u for _, u in ranked[:2]} == {20, 30, 40}
    best = best_checkpoints(tmp_path / "checkpoints", 2)
    assert [p.name for p in best] == ["ckpt-00000020", "ckpt-00000030"]
    averaged = average_best(tmp_path, 2)
    assert averaged.path.name == "best2-ckpt-00000030"
    fresh = built_transducer()
    restore(fresh, averaged.path)
    for name, var in named_variables(fresh).items():
        if is_float(var):
            want = (saved[20][name].astype(np.float64) + saved[30][name]) / 2
            np.testing.assert_allclose(var.numpy(), want.astype(var.dtype), rtol=0, atol=0)
    with pytest.raises(CheckpointError, match=r"3 checkpoint\(s\) with a dev WER.*best 4"):
        average_best(tmp_path, 4)


def test_names_are_attribute_paths_the_same_in_every_instance():
    names = list(named_variables(built_transducer()))
    assert names == list(named_variables(built_transducer()))  # Keras' paths get suffixes
    assert "joint.output_layer.kernel" in names and "encoder.seeds.state" in names
    assert len(names) == len(set(names)) == len(built_transducer().variables)


class _Pair(keras.Model):
    """Two same-shape layers; `first_b` creates them in the other order."""

    def __init__(self, first_b=False):
        super().__init__()
        if first_b:
            self.b = keras.layers.Dense(3)
            self.a = keras.layers.Dense(3)
        else:
            self.a = keras.layers.Dense(3)
            self.b = keras.layers.Dense(3)

    def call(self, x):
        return self.a(x) + self.b(x)


def test_variables_are_matched_by_name_not_creation_order(tmp_path):
    a_first, b_first = _Pair(), _Pair(first_b=True)
    for model in (a_first, b_first):
        model(np.zeros((1, 3), np.float32))
    rng = np.random.default_rng(1)
    want = randomize(a_first, rng)
    from asrkit.checkpoints import write_weights

    write_weights(tmp_path / "w", want, TrainState(0, 0, 1))
    restore(b_first, tmp_path / "w")
    got = {k: v.numpy() for k, v in named_variables(b_first).items()}
    assert got.keys() == want.keys() == {"a.kernel", "a.bias", "b.kernel", "b.bias"}
    for name in want:
        np.testing.assert_array_equal(got[name], want[name], err_msg=name)
    # Creation order would have swapped them: b_first's first variable is b.kernel.
    assert b_first.variables[0] is named_variables(b_first)["b.kernel"]


def test_replacing_a_checkpoint_never_loses_it(tmp_path, monkeypatch):
    model = built_transducer()
    rng = np.random.default_rng(2)
    manager = CheckpointManager(tmp_path, keep=1)
    first = randomize(model, rng)
    path = manager.save(model, TrainState(0, 4, 5))
    randomize(model, rng, 2.0)

    # A failing write of the replacement leaves the original whole.
    def broken(self, *args, **kwargs):
        raise tf.errors.ResourceExhaustedError(None, None, "No space left on device")

    with monkeypatch.context() as patch:
        patch.setattr(tf.train.Checkpoint, "write", broken)
        with pytest.raises(CheckpointError, match=r"No space left.*earlier checkpoints"):
            manager.save(model, TrainState(1, 0, 5))
    assert not list(tmp_path.glob("*.tmp")) and manager.checkpoints() == [path]
    assert read_weights(path).keys() == first.keys()
    for name, value in read_weights(path).items():
        np.testing.assert_array_equal(value, first[name], err_msg=name)

    # Killed after the original was moved aside, before the new one was renamed in.
    real_replace, calls = os.replace, []

    def killed(src, dst):
        calls.append((src, dst))
        if str(src).endswith(".tmp"):
            raise KeyboardInterrupt
        real_replace(src, dst)

    with monkeypatch.context() as patch:
        patch.setattr(os, "replace", killed)
        with pytest.raises(KeyboardInterrupt):
            manager.save(model, TrainState(1, 0, 5))
    assert not path.exists() and calls  # the window a crash would hit
    recovered = CheckpointManager(tmp_path, keep=1).checkpoints()
    assert recovered == [path] and json.loads((path / "state.json").read_text())["epoch"] == 0


def test_failed_save_with_enospc_is_a_checkpoint_error(tmp_path, monkeypatch):
    model = built_transducer()
    manager = CheckpointManager(tmp_path, keep=3)
    kept = [manager.save(model, TrainState(0, i, i)) for i in (1, 2)]

    def full(self, *args, **kwargs):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(tf.train.Checkpoint, "write", full)
    with pytest.raises(CheckpointError, match=r"ckpt-00000003.*No space left on device"):
        manager.save(model, TrainState(0, 3, 3))
    assert manager.checkpoints() == kept and not list(tmp_path.glob("*.tmp"))


def test_listing_ignores_what_is_not_a_checkpoint(tmp_path):
    model = built_transducer()
    manager = CheckpointManager(tmp_path, keep=5)
    real = manager.save(model, TrainState(0, 0, 7))
    for junk in ("ckpt-00000010.tmp", "ckpt-00001000.bak", "ckpt-x", "ckpt-12-old"):
        (tmp_path / junk).mkdir()
        (tmp_path / junk / "state.json").write_text("{}")
    assert list_checkpoints(tmp_path) == [real]


def test_fine_tune_loading_reports_every_variable_by_name(tmp_path):
    conformer = ModelConfig(
        encoder=EncoderConfig(d_model=8, num_blocks=1, num_heads=2, kernel_size=3,
                              subsampling_filters=4),
        predictor=tiny_model_config(units=8).predictor, joint_dim=8,
    )  # fmt: skip
    source = built_transducer(conformer)
    CheckpointManager(tmp_path, keep=1).save(source, TrainState(0, 0, 1))
    target = built_transducer(tiny_model_config(units=8), vocab=12)  # LSTM encoder, new vocab
    report = load_matching_weights(target, tmp_path / "ckpt-00000001")
    target_names, source_names = set(named_variables(target)), set(named_variables(source))
    assert set(report.loaded) | {k for k, _ in report.skipped} | set(report.fresh) == target_names
    assert set(report.fresh) == target_names - source_names
    assert set(report.unused) == source_names - target_names
    assert {k for k, _ in report.skipped} == {
        "predictor.embedding.embeddings", "joint.output_layer.kernel", "joint.output_layer.bias"
    }  # fmt: skip
    assert "joint.predictor_proj.kernel" in report.loaded
    assert all(k.startswith("encoder.") for k in report.fresh)


def _three_checkpoints(directory):
    model = built_transducer()
    manager = CheckpointManager(directory, keep=3)
    for updates in (1, 2, 3):
        manager.save(model, TrainState(0, updates, updates))
    return manager.checkpoints()


@pytest.mark.parametrize(
    ("damage", "says"),
    [
        (lambda c: _truncate(c / "ckpt.data-00000-of-00001", 100), "bytes, .* were written"),
        (lambda c: (c / "ckpt.index").write_bytes(b""), "bytes, .* were written"),
        (lambda c: _flip_a_byte(c / "ckpt.data-00000-of-00001"), "checksum mismatch"),
        (lambda c: (c / "ckpt.index").unlink(), "no ckpt.index"),
        (lambda c: (c / "files.json").unlink(), "files.json: missing"),
    ],
)
def test_a_damaged_checkpoint_is_named_with_the_newest_intact_one(tmp_path, damage, says):
    _, second, third = _three_checkpoints(tmp_path)
    damage(third)
    with pytest.raises(CheckpointError, match=says) as err:
        restore(built_transducer(), third)
    message = str(err.value)
    assert "\n" not in message
    if "no ckpt.index" not in message:
        assert f"pass --checkpoint {second}" in message
    assert newest_intact(tmp_path) == second
    restore(built_transducer(), second)  # the others are fine


def test_a_checkpoint_damaged_after_its_record_is_refused_by_tensorflow_not_crashed(tmp_path):
    """Damage the record cannot see (a consistent record of bad files): TensorFlow's own
    error becomes a one-line CheckpointError."""
    (checkpoint,) = _three_checkpoints(tmp_path)[-1:]
    (checkpoint / "ckpt.index").write_bytes(b"not an sstable")
    record = json.loads((checkpoint / "files.json").read_text())
    record["ckpt.index"] = {"bytes": 14, "sha256": hashlib.sha256(b"not an sstable").hexdigest()}
    (checkpoint / "files.json").write_text(json.dumps(record))
    with pytest.raises(CheckpointError, match="TensorFlow cannot read it"):
        read_weights(checkpoint)


def _truncate(path, size):
    with open(path, "r+b") as f:
        f.truncate(size)


def _flip_a_byte(path):
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))


def _with_optimizer():
    network = built_transducer()
    optimizer = keras.optimizers.Adam(0.1)
    optimizer.build(network.trainable_variables)
    return network, optimizer


def test_a_checkpoint_holds_each_weight_and_slot_once(tmp_path):
    """The weights once (the optimizer tracks the same variables) and the optimizer's own
    variables: nothing written twice."""
    network, optimizer = _with_optimizer()
    path = CheckpointManager(tmp_path, keep=1).save(network, TrainState(0, 0, 1), optimizer)
    saved = tf.train.list_variables(str(path / "ckpt"))
    values = sum(int(np.prod(shape)) for name, shape in saved if "VARIABLE_VALUE" in name)
    slots = sum(int(np.prod(v.shape)) for v in optimizer.variables)
    weights = sum(int(np.prod(v.shape)) for v in named_variables(network).values())
    assert values == weights + slots
    assert set(read_weights(path)) == set(named_variables(network))  # under weights/


def test_resume_restores_the_optimizer_and_refuses_unmatched_slots(tmp_path):
    network, optimizer = _with_optimizer()
    for slot in optimizer.variables:
        slot.assign(np.full(slot.shape, 3, np.dtype(slot.dtype)))
    path = CheckpointManager(tmp_path, keep=1).save(network, TrainState(0, 0, 1), optimizer)
    again, fresh_optimizer = _with_optimizer()
    restore(again, path, fresh_optimizer)
    assert all(np.all(s.numpy() == 3) for s in fresh_optimizer.variables)

    order = json.loads((path / "variables.json").read_text())
    (path / "variables.json").write_text(json.dumps(order[::-1]))
    _record_files(path)  # as if it had been written so: intact, of another variable order
    with pytest.raises(CheckpointError, match="--init-from"):
        restore(*_with_optimizer()[:1], path, _with_optimizer()[1])
    restore(built_transducer(), path)  # the weights alone still load


def _conformer_config(**encoder):
    fields = dict(kind="conformer", d_model=16, num_blocks=2, num_heads=2, kernel_size=5,
                  subsampling_filters=8, dropout=0.0)  # fmt: skip
    return ModelConfig(encoder=EncoderConfig(**{**fields, **encoder}), joint_dim=16)


@pytest.mark.parametrize(
    "other",
    [dict(num_blocks=1), dict(final_norm="none")],
    ids=["fewer blocks", "no per-block norms"],
)
def test_a_checkpoint_with_variables_the_model_lacks_is_refused(tmp_path, other):
    """A model whose variables are a subset of a checkpoint's is another architecture:
    loading it for decoding must fail loudly, not use part of the weights."""
    trained = built_transducer(_conformer_config(final_norm="block"))
    manager = CheckpointManager(tmp_path, keep=1)
    path = manager.save(trained, TrainState(epoch=1, micro_batches=0, updates=1))
    smaller = built_transducer(_conformer_config(**{"final_norm": "block", **other}))
    assert set(named_variables(smaller)) < set(read_weights(path))
    with pytest.raises(CheckpointError, match="the model does not have"):
        restore(smaller, path)
    restore(built_transducer(_conformer_config(final_norm="block")), path)  # the same fits
