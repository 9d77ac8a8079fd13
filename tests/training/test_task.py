"""The training task's loss terms: the auxiliary CTC loss adds exactly `loss.ctc_weight` × the
CTC loss of its head's logits to each utterance, and only a network trained with it carries
the head; dynamic chunk training uses the chunk of the current update."""

import dataclasses

import keras
import numpy as np
import pytest
import tensorflow as tf

from asrkit.config import EncoderConfig, LossConfig
from asrkit.losses import ctc_losses
from asrkit.models.conformer import dynamic_chunk_frames
from asrkit.models.transducer import Transducer
from asrkit.training.task import TransducerTask
from tests.tiny import tiny_model_config


@pytest.mark.parametrize("fused", [True, False])
def test_auxiliary_ctc_adds_its_weighted_loss_to_each_utterance(fused):
    rng = np.random.default_rng(3)
    batch = (rng.standard_normal((3, 64, 80)).astype(np.float32), np.array([64, 40, 28]),
             np.array([[1, 2, 2, 4], [5, 6, 0, 0], [7, 0, 0, 0]], np.int32),
             np.array([4, 2, 1]))  # fmt: skip
    keras.utils.set_random_seed(0)
    plain = TransducerTask(Transducer(9, tiny_model_config()), LossConfig(fused=fused))
    with_ctc = TransducerTask(
        Transducer(9, tiny_model_config()), LossConfig(fused=fused, ctc_weight=0.4)
    )
    for task in (plain, with_ctc):
        task.build_heads(80)
    with_ctc.network.set_weights(plain.network.get_weights())
    # The head is the task's (its loss'), never the network's: inference never builds it.
    assert plain.heads.ctc is None and with_ctc.heads.ctc is not None
    assert len(with_ctc.network.weights) == len(plain.network.weights)
    assert len(with_ctc.trainable_variables) == len(plain.trainable_variables) + 2
    base, count = plain.compute_loss_terms(batch, training=False)
    total, same_count = with_ctc.compute_loss_terms(batch, training=False)
    encoded, lengths = with_ctc.network.encode(batch[0], batch[1])
    ctc = ctc_losses(with_ctc.heads.ctc(encoded), batch[2], lengths, batch[3], blank=0)
    assert int(count) == int(same_count) == 7
    assert float(tf.reduce_sum(ctc)) > 0
    assert float(total) == pytest.approx(float(base) + 0.4 * float(tf.reduce_sum(ctc)), rel=1e-5)


def test_dynamic_chunks_train_each_update_with_that_updates_chunk():
    """With model.encoder.dynamic_chunks the training loss at update u is the loss of the
    same weights configured with the chunk `dynamic_chunk_frames(u)` draws (0: full
    context); evaluation uses the configured chunk."""
    rng = np.random.default_rng(4)
    batch = (rng.standard_normal((2, 120, 80)).astype(np.float32), np.array([120, 77]),
             np.array([[1, 2, 3], [4, 5, 0]], np.int32), np.array([3, 2]))  # fmt: skip
    encoder = EncoderConfig(kind="conformer", d_model=16, num_blocks=2, num_heads=2,
                            kernel_size=5, subsampling_filters=8, dropout=0.0,
                            chunk_frames=4)  # fmt: skip
    dynamic_config = dataclasses.replace(
        tiny_model_config(), encoder=dataclasses.replace(encoder, dynamic_chunks=6)
    )
    keras.utils.set_random_seed(1)
    task = TransducerTask(Transducer(9, dynamic_config))
    task.compile(keras.optimizers.SGD(0.1))
    task.network.build_from_features(80)

    def fixed_loss(chunk):
        config = dataclasses.replace(
            dynamic_config, encoder=dataclasses.replace(encoder, chunk_frames=chunk or 10_000)
        )
        other = TransducerTask(Transducer(9, config))
        other.network.build_from_features(80)
        other.network.set_weights(task.network.get_weights())
        return float(other.compute_loss_terms(batch, training=True)[0])

    drawn = {}
    for updates in range(12):
        task.optimizer.iterations.assign(updates)
        drawn.setdefault(int(dynamic_chunk_frames(updates, 6)), updates)
    assert 0 in drawn and len(drawn) >= 3, drawn
    for chunk, updates in drawn.items():
        task.optimizer.iterations.assign(updates)
        got = float(task.compute_loss_terms(batch, training=True)[0])
        assert got == pytest.approx(fixed_loss(chunk), rel=1e-5), chunk
    assert float(task.compute_loss_terms(batch, training=False)[0]) == pytest.approx(
        fixed_loss(4), rel=1e-5
    )


def test_the_pruned_loss_is_the_same_fused_or_plain():
    """`loss.fused` with `loss.kind: pruned` (the simple loss' projection and
    the band chunk by chunk) = the plain pruned loss: the loss and every variable's
    gradient, smoothing on."""
    rng = np.random.default_rng(4)
    batch = (rng.standard_normal((3, 64, 80)).astype(np.float32),
             np.array([64, 40, 28], np.int32),
             np.array([[1, 2, 2, 4], [5, 6, 0, 0], [7, 0, 0, 0]], np.int32),
             np.array([4, 2, 1], np.int32))  # fmt: skip
    loss = LossConfig(kind="pruned", prune_range=2, lm_only_scale=0.25, am_only_scale=0.1,
                      pruned_chunk_mb=0.01)  # fmt: skip
    results, weights = [], None
    for fused in (False, True):
        keras.utils.set_random_seed(0)
        task = TransducerTask(
            Transducer(9, tiny_model_config(predictor="stateless")),
            dataclasses.replace(loss, fused=fused),
        )
        task.build_heads(80)
        weights = weights or [v.numpy() for v in task.trainable_variables]
        for variable, value in zip(task.trainable_variables, weights, strict=True):
            variable.assign(value)
        with tf.GradientTape() as tape:
            total, _ = task.compute_loss_terms(batch, training=False)
        variables = task.trainable_variables
        results.append([total, *tape.gradient(total, variables)])
    assert len(results[1]) > 10
    for got, want in zip(results[1], results[0], strict=True):
        got, want = tf.convert_to_tensor(got), tf.convert_to_tensor(want)  # embeddings: slices
        np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-4, atol=1e-5)
