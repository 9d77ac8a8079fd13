"""The memory probe: the right micro-batch shape, a clear error, and no side effects."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from asrkit.data.pipeline import PipelineConfig, bucket_plan
from asrkit.features import encoder_frames
from asrkit.models.transducer import Transducer, dummy_batch
from asrkit.training.probe import OutOfMemory, largest_micro_batch, probe_memory
from asrkit.training.task import TransducerTask
from tests.tiny import tiny_model_config


def brute_force(frames, tokens, plan, replicas):
    """Every micro-batch the bucketing can form from the longest members of each bucket."""
    boundaries, sizes = plan
    best = 0
    for i, (b, s) in enumerate(zip(boundaries, sizes, strict=True)):
        low = boundaries[i - 1] if i else 0
        members = [(f, t) for f, t in zip(frames, tokens, strict=True) if low <= f < b]
        if members:
            rows = -(-min(s, len(members)) // replicas)
            u = max(t for _, t in members)
            best = max(best, rows * encoder_frames(b - 1) * (u + 1))
    return best


@pytest.mark.parametrize("replicas", [1, 2, 3])
def test_largest_micro_batch_is_the_most_cells(replicas):
    rng = np.random.default_rng(replicas)
    frames = rng.integers(100, 3000, size=400)
    tokens = (frames / 30 + rng.integers(0, 20, size=400)).astype(int)
    plan = bucket_plan(frames, PipelineConfig(batch_seconds=120.0, num_buckets=6))
    shape = largest_micro_batch(frames, tokens, plan, replicas)
    assert shape.cells == brute_force(frames, tokens, plan, replicas)
    assert shape.frames + 1 in plan[0]


def built_model():
    keras.utils.set_random_seed(0)
    model = TransducerTask(Transducer(9, tiny_model_config(dropout=0.3)))
    model.compile(keras.optimizers.SGD(0.1))
    model.build_engine(dummy_batch(80))
    return model


def test_probe_changes_no_variable_not_even_the_dropout_state():
    model = built_model()
    before = [v.numpy().copy() for v in model.variables]
    shape = largest_micro_batch([300, 500], [20, 30], ([400, 501], [2, 1]))
    probe_memory(model, tf.distribute.get_strategy(), shape, 80)
    for var, value in zip(model.variables, before, strict=True):
        np.testing.assert_array_equal(var.numpy(), value, err_msg=var.path)


def test_out_of_memory_is_explained(monkeypatch):
    model = built_model()

    def exhausted(batch, training=True):
        raise tf.errors.ResourceExhaustedError(None, None, "OOM when allocating tensor")

    monkeypatch.setattr(model, "compute_loss_terms", exhausted)
    shape = largest_micro_batch([300] * 6, [20] * 6, ([301], [4]))
    with pytest.raises(OutOfMemory, match=r"4 utterance\(s\) x 300 frames.*batch_seconds"):
        probe_memory(model, tf.distribute.get_strategy(), shape, 80)
