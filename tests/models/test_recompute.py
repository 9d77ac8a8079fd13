"""Recomputed encoder blocks: the same loss and gradients as stored activations, with
dropout on (its masks are replayed from explicit seeds), eager and in a graph."""

import dataclasses

import keras
import numpy as np
import pytest
import tensorflow as tf

from asrkit.config import ModelConfig, PredictorConfig
from asrkit.models.transducer import Transducer
from asrkit.training.task import TransducerTask
from tests.tiny import tiny_encoder

CONFIG = ModelConfig(
    predictor=PredictorConfig(embed_dim=8, units=16, dropout=0.0),
    joint_dim=16,
)
RNG = np.random.default_rng(3)
BATCH = (RNG.standard_normal((3, 64, 80)).astype(np.float32), np.array([64, 47, 30]),
         np.array([[1, 2, 3, 4], [5, 6, 0, 0], [7, 0, 0, 0]], np.int32),
         np.array([4, 2, 0]))  # fmt: skip


# Two layers each, dropout on: the recomputation must replay every mask.
KINDS = {
    "conformer": dict(num_blocks=2, dropout=0.3),
    "lstm": dict(lstm_layers=2, dropout=0.3),
    # an imported NeMo FastConformer's architecture (frozen BatchNorm, as fine-tuning keeps it)
    "nemo_conformer": dict(num_blocks=2, dropout=0.3),
}


def _loss_and_grads(kind, recompute, graph):
    encoder = tiny_encoder(kind, recompute=recompute, **KINDS[kind])
    keras.utils.set_random_seed(0)  # same weights and the same dropout seed stream
    task = TransducerTask(Transducer(12, dataclasses.replace(CONFIG, encoder=encoder)))
    task.compute_loss_terms(BATCH, training=False)  # build

    def step(batch):
        with tf.GradientTape() as tape:
            loss_sum, _ = task.compute_loss_terms(batch, training=True)
        return loss_sum, tape.gradient(loss_sum, task.trainable_variables)

    run = tf.function(step, autograph=False) if graph else step
    return [run(BATCH) for _ in range(2)]  # two calls: the seed stream advances alike


@pytest.mark.parametrize("graph", [pytest.param(False, marks=pytest.mark.slow), True])
@pytest.mark.parametrize("kind", list(KINDS))
def test_recomputed_blocks_give_the_same_loss_and_gradients(kind, graph):
    stored = _loss_and_grads(kind, recompute=False, graph=graph)
    recomputed = _loss_and_grads(kind, recompute=True, graph=graph)
    for (loss_a, grads_a), (loss_b, grads_b) in zip(stored, recomputed, strict=True):
        assert float(loss_b) == pytest.approx(float(loss_a), rel=1e-6)
        assert len(grads_a) == len(grads_b) > 10
        for a, b in zip(grads_a, grads_b, strict=True):
            a, b = tf.convert_to_tensor(a).numpy(), tf.convert_to_tensor(b).numpy()
            np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-6 * np.max(np.abs(a)))
    # Dropout really drew different masks on the second call (the check is not vacuous).
    assert float(stored[0][0]) != float(stored[1][0])
