"""A replica's empty share of a micro-batch contributes exactly nothing.

A global micro-batch with fewer utterances than replicas leaves some replica an empty
batch. Some CPU kernels return their output buffer unwritten for an empty batch (the
depthwise convolution's filter gradient in TensorFlow 2.21, on some machines), and
BatchNorm's moments of no items are 0 / 0 = NaN: neither may reach the weights, the moving
statistics or the window's loss and count.
"""

import dataclasses

import keras
import numpy as np
import pytest
import tensorflow as tf

from asrkit.config import EncoderConfig, LossConfig
from asrkit.models.transducer import Transducer
from asrkit.training.task import TransducerTask
from tests.tiny import tiny_encoder, tiny_model_config
from tests.training.toy import (
    TokenRegressor,
    assert_weights_close,
    make_batches,
    make_dataset,
    reference_run,
    weights,
    windows_of,
)

FRAMES, FEATURES, LABELS = 48, 80, 3


@tf.custom_gradient
def _kernel_bug(kernel, items):
    """0 in the forward pass; a gradient as a buggy kernel gives it: exact for a non-empty
    batch, `GARBAGE` (unwritten memory) for an empty one."""

    def grad(upstream):
        garbage = tf.fill(tf.shape(kernel), _kernel_bug.garbage)
        return tf.where(items > 0, tf.zeros_like(kernel), garbage), None

    return tf.zeros([]), grad


class BuggyKernelRegressor(TokenRegressor):
    def compute_loss_terms(self, data, training=True):
        loss_sum, count = super().compute_loss_terms(data, training)
        return loss_sum + _kernel_bug(self.out.kernel, tf.shape(data[0])[0]), count


@pytest.mark.parametrize("garbage", [1e30, np.nan, np.inf])
def test_garbage_gradients_of_an_empty_share_never_reach_the_weights(mirrored, garbage):
    """Micro-batches of one item leave replica 1 empty; its garbage gradient (finite, so a
    finiteness check would let it through, or NaN/inf, which would skip the window) is
    selected away and the update is the union batch's."""
    _kernel_bug.garbage = garbage
    batches = make_batches([3, 1, 4, 1, 1, 2])
    with mirrored.scope():
        keras.utils.set_random_seed(1)
        model = BuggyKernelRegressor()
        model.compile(keras.optimizers.SGD(0.1), accumulation_steps=2)
        model.build_engine(batches[0])
    initial = weights(model)
    model.fit(make_dataset(batches), verbose=0)
    want, _ = reference_run(initial, windows_of(batches, 2), keras.optimizers.SGD(0.1))
    assert_weights_close(weights(model), want)
    assert int(model._engine.skipped.numpy()) == 0


def _conformer_task(conv_norm: str) -> TransducerTask:
    """conv_norm "nemo": an imported NeMo transducer's architecture (NeMo's Conformer with
    frozen BatchNorm, FastConformer subsampling, the blank-as-padding predictor, a ReLU
    joint); "nemo_tdt": the same with a TDT joint and the fused TDT loss in small chunks."""
    if conv_norm in ("nemo", "nemo_tdt"):
        encoder = tiny_encoder("nemo_conformer")
        base = tiny_model_config()
        tdt = conv_norm == "nemo_tdt"
        config = dataclasses.replace(
            base, encoder=encoder, joint_activation="relu",
            predictor=dataclasses.replace(base.predictor, blank_as_pad=True),
            durations=(0, 1, 2) if tdt else (),
        )  # fmt: skip
        keras.utils.set_random_seed(2)
        loss = LossConfig(kind="tdt", sigma=0.05, chunk_mb=0.01) if tdt else None
        return TransducerTask(Transducer(9, config), loss)
    hybrid = conv_norm == "hybrid"  # LayerNorm, and a CTC head with its loss
    encoder = EncoderConfig(kind="conformer", d_model=16, num_blocks=1, num_heads=2,
                            kernel_size=5, subsampling_filters=8, dropout=0.0,
                            conv_norm="layer" if hybrid else conv_norm,
                            final_norm="block")  # fmt: skip
    config = dataclasses.replace(tiny_model_config(), encoder=encoder, ctc_head=hybrid)
    keras.utils.set_random_seed(2)
    return TransducerTask(Transducer(9, config), LossConfig(ctc_weight=0.3) if hybrid else None)


def _utterances(count: int, seed: int):
    rng = np.random.default_rng(seed)
    feats = rng.standard_normal((count, FRAMES, FEATURES)).astype(np.float32)
    lengths = rng.integers(FRAMES // 2, FRAMES + 1, count).astype(np.int32)
    label_lengths = rng.integers(1, LABELS + 1, count).astype(np.int32)
    labels = rng.integers(1, 9, (count, LABELS)).astype(np.int32)
    labels[np.arange(LABELS)[None, :] >= label_lengths[:, None]] = 0
    return feats, lengths, labels, label_lengths


def _dataset(batches):
    parts = [tf.data.Dataset.from_tensor_slices(b).batch(len(b[0])) for b in batches]
    dataset = parts[0]
    for part in parts[1:]:
        dataset = dataset.concatenate(part)
    return dataset


def _fit(task, batches, strategy, steps):
    with strategy.scope():
        task.compile(keras.optimizers.SGD(0.5), accumulation_steps=steps)
        task.build_engine(batches[0])
    initial = [v.numpy().copy() for v in task.network.weights]
    task.fit(_dataset(batches), verbose=0)
    return initial


def _union_update(conv_norm, initial, batches):
    """One SGD step on d(Σ loss / Σ count)/dw of all the batches as one batch."""
    task = _conformer_task(conv_norm)
    union = tuple(np.concatenate([b[i] for b in batches]) for i in range(4))
    task.compute_loss_terms(union, training=False)
    for variable, value in zip(task.network.weights, initial, strict=True):
        variable.assign(value)
    with tf.GradientTape() as tape:
        loss_sum, count = task.compute_loss_terms(union, training=True)
        loss = loss_sum / tf.cast(count, tf.float32)
    variables = task.trainable_variables
    keras.optimizers.SGD(0.5).apply(tape.gradient(loss, variables), variables)
    return [v.numpy() for v in task.network.weights]


# "layer" differs from "frozen_batch" in the norm only, "nemo" from "nemo_tdt" in the loss
# only (the fused RNN-T loss is in "frozen_batch"): those two run in the slow tier.
@pytest.mark.parametrize("conv_norm", [pytest.param("layer", marks=pytest.mark.slow),
                                       "frozen_batch",
                                       pytest.param("nemo", marks=pytest.mark.slow),
                                       "nemo_tdt", "hybrid"])  # fmt: skip
def test_a_conformer_update_with_an_empty_share_equals_the_union_batch(mirrored, conv_norm):
    """Two replicas, micro-batches of 4 and 1 utterances: replica 1's share of the second is
    empty. The update equals the union batch's; frozen BatchNorm statistics do not move."""
    batches = [_utterances(4, 0), _utterances(1, 1)]
    with mirrored.scope():
        task = _conformer_task(conv_norm)
    initial = _fit(task, batches, mirrored, steps=2)
    want = _union_update(conv_norm, initial, batches)
    got = [v.numpy() for v in task.network.weights]
    assert_weights_close(got, want, rtol=1e-4, atol=1e-5)
    moved = max(float(np.max(np.abs(g - i))) for g, i in zip(got, initial, strict=True))
    assert moved > 1e-3  # the update did something


def test_batch_norm_statistics_survive_an_empty_share(mirrored):
    """BatchNorm from batch statistics: micro-batches of one utterance each, so each replica
    0 share is exactly what a single device sees and replica 1's is empty. Weights and
    moving statistics equal the single-device run's; none is NaN."""
    batches = [_utterances(1, seed) for seed in range(3)]
    with mirrored.scope():
        task = _conformer_task("batch")
    _fit(task, batches, mirrored, steps=3)
    single = _conformer_task("batch")
    _fit(single, batches, tf.distribute.get_strategy(), steps=3)
    got = [v.numpy() for v in task.network.weights]
    assert all(np.isfinite(g).all() for g in got)
    assert_weights_close(got, [v.numpy() for v in single.network.weights], rtol=1e-4, atol=1e-5)


def _churn():
    """Allocates, fills and frees buffers of many sizes, so that the next kernels are handed
    reused memory holding large values (what exposes a kernel that leaves its output
    unwritten)."""
    for size in (5 * 16, 5 * 16 * 16, 4096, 65536):
        filled = tf.fill([size], 1e30) + tf.random.uniform([size])
        del filled


@pytest.mark.parametrize("conv_norm", ["layer", "batch"])
def test_an_empty_share_leaves_the_accumulators_at_zero_call_after_call(conv_norm):
    """The engine's micro-step on an empty batch, traced with an unknown batch size as a
    distributed step is, 20 times with memory churn between: accumulators, loss sum and
    count stay exactly 0 and BatchNorm's moving statistics exactly as they were."""
    task = _conformer_task(conv_norm)
    task.compile(keras.optimizers.SGD(0.1), accumulation_steps=2)
    task.build_engine(_utterances(2, 0))
    spec = (tf.TensorSpec([None, None, FEATURES]), tf.TensorSpec([None], tf.int32),
            tf.TensorSpec([None, None], tf.int32), tf.TensorSpec([None], tf.int32))  # fmt: skip
    micro_step = tf.function(task._micro_step, input_signature=[spec], autograph=False)
    empty = (np.zeros((0, FRAMES, FEATURES), np.float32), np.zeros((0,), np.int32),
             np.zeros((0, LABELS), np.int32), np.zeros((0,), np.int32))  # fmt: skip
    statistics = [v for v in task.network.weights if "moving" in v.path]
    assert len(statistics) == (2 if conv_norm == "batch" else 0)
    before = [v.numpy().copy() for v in statistics]
    engine = task._engine
    for _ in range(20):
        _churn()
        micro_step(empty)
        assert all(not np.any(acc.numpy()) for acc in engine.grads)
        assert float(engine.loss_sum.numpy()) == 0.0 and float(engine.count.numpy()) == 0.0
        for variable, value in zip(statistics, before, strict=True):
            np.testing.assert_array_equal(variable.numpy(), value)
