"""Checkpoint averaging: float64 mean of the last N, integer state from the last one."""

import keras
import numpy as np
import pytest

from asrkit.decoding.runner import dummy_batch
from asrkit.models.transducer import Transducer
from asrkit.training.checkpoints import (
    CheckpointManager,
    TrainState,
    average_last,
    list_checkpoints,
    restore,
)
from tests.tiny import tiny_model_config


def built_transducer():
    model = Transducer(9, tiny_model_config(units=8, dropout=0.1))
    model.compile(keras.optimizers.SGD(0.1))
    model.build_engine(dummy_batch(80))
    return model


def is_float(var) -> bool:
    return np.issubdtype(np.dtype(var.dtype), np.floating)


def test_average_last_n(tmp_path):
    keras.utils.set_random_seed(0)
    model = built_transducer()
    assert any(not is_float(v) for v in model.variables)  # dropout RNG states
    manager = CheckpointManager(tmp_path / "checkpoints", keep=5)
    rng = np.random.default_rng(0)
    saved = []
    for updates in (10, 20, 30):
        values = []
        for var in model.variables:
            if is_float(var):
                var.assign(rng.standard_normal(var.shape).astype(np.float32) * updates)
            else:
                var.assign(np.full(var.shape, updates, np.dtype(var.dtype)))
            values.append(var.numpy().copy())
        saved.append(values)
        manager.save(model, TrainState(epoch=updates // 10, micro_batches=0, updates=updates))

    out, sources = average_last(tmp_path, last=2)
    assert [p.name for p in sources] == [p.name for p in list_checkpoints(manager.directory)[-2:]]
    assert not list_checkpoints(out.parent)  # kept apart from the training checkpoints

    fresh = built_transducer()
    state = restore(fresh, out, with_optimizer=False)
    assert state.updates == 30
    for i, var in enumerate(fresh.variables):
        got = var.numpy()
        if is_float(var):
            want = (saved[1][i].astype(np.float64) + saved[2][i].astype(np.float64)) / 2
            assert got.dtype == saved[2][i].dtype
            np.testing.assert_allclose(got, want.astype(got.dtype), rtol=0, atol=0)
        else:
            np.testing.assert_array_equal(got, saved[2][i])


def test_averaging_more_than_kept_is_a_clear_error(tmp_path):
    model = built_transducer()
    manager = CheckpointManager(tmp_path / "checkpoints", keep=2)
    for updates in (1, 2, 3):
        manager.save(model, TrainState(0, 0, updates))
    with pytest.raises(ValueError, match=r"2 checkpoint.*last 3.*keep_checkpoints"):
        average_last(tmp_path, last=3)
