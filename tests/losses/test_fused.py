"""The fused joint + loss equals the joint followed by `rnnt_loss`: losses and gradients of
every input and weight, for any chunk size, with padding, U = 0 and V up to 1024."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from asrkit.losses import fused_rnnt_loss, rnnt_loss


def _fused(enc, pred, kernel, bias, labels, frame_lengths, label_lengths, **settings):
    """The fused loss with the arguments in the order the cases hold them."""
    return fused_rnnt_loss(enc, pred, labels, frame_lengths, label_lengths, kernel=kernel,
                           bias=bias, **settings)  # fmt: skip


def _case(seed, batch=3, frames=13, max_u=5, hidden=16, vocab=64):
    rng = np.random.default_rng(seed)
    enc = tf.constant(rng.standard_normal((batch, frames, hidden)), tf.float32)
    pred = tf.constant(rng.standard_normal((batch, max_u + 1, hidden)), tf.float32)
    kernel = tf.Variable(rng.standard_normal((hidden, vocab)).astype(np.float32) * 0.3)
    bias = tf.Variable(rng.standard_normal(vocab).astype(np.float32) * 0.1)
    labels = tf.constant(rng.integers(1, vocab, (batch, max_u)), tf.int32)
    # full length, padded frames and labels, and an utterance with no labels (U = 0)
    frame_lengths = tf.constant([frames, frames - 4, 2][:batch], tf.int32)
    label_lengths = tf.constant([max_u, 2, 0][:batch], tf.int32)
    return enc, pred, kernel, bias, labels, frame_lengths, label_lengths


def _losses_and_grads(loss_fn, enc, pred, kernel, bias, *rest):
    weights = tf.constant([1.0, -0.5, 2.0])[: enc.shape[0]]
    with tf.GradientTape() as tape:
        tape.watch([enc, pred])
        losses = loss_fn(enc, pred, kernel, bias, *rest)
        total = tf.reduce_sum(losses * weights)
    return losses, tape.gradient(total, [enc, pred, kernel, bias])


def _plain(enc, pred, kernel, bias, labels, frame_lengths, label_lengths):
    logits = tf.matmul(tf.tanh(enc[:, :, None] + pred[:, None]), kernel) + bias
    return rnnt_loss(logits, labels, frame_lengths, label_lengths)


def _assert_grads_close(got, want, rtol):
    for g, w in zip(got, want, strict=True):
        g, w = tf.convert_to_tensor(g).numpy(), tf.convert_to_tensor(w).numpy()
        assert np.max(np.abs(g - w)) <= rtol * np.max(np.abs(w)), np.max(np.abs(g - w))


@pytest.mark.parametrize("vocab", [64, 1024])
@pytest.mark.parametrize("chunk", [1, 4, 13, 40, None])
def test_fused_equals_joint_then_loss(vocab, chunk):
    case = _case(seed=vocab + (chunk or 0), vocab=vocab)
    want_losses, want = _losses_and_grads(_plain, *case)

    def fused(*args):
        return _fused(*args, chunk_frames=chunk)

    losses, got = _losses_and_grads(fused, *case)
    np.testing.assert_allclose(losses.numpy(), want_losses.numpy(), rtol=1e-5)
    _assert_grads_close(got, want, rtol=1e-5)
    # Padding frames and the padded predictor rows get exactly zero gradient.
    assert not np.any(got[0].numpy()[1, -4:]) and not np.any(got[0].numpy()[2, 2:])
    assert not np.any(got[1].numpy()[2, 1:])


def test_fused_with_a_delay_penalty_equals_joint_then_loss():
    case = _case(seed=5, vocab=64)

    def plain(enc, pred, kernel, bias, labels, frame_lengths, label_lengths):
        logits = tf.matmul(tf.tanh(enc[:, :, None] + pred[:, None]), kernel) + bias
        return rnnt_loss(logits, labels, frame_lengths, label_lengths, delay_penalty=0.1)

    def fused(*args):
        return _fused(*args, chunk_frames=4, delay_penalty=0.1)

    want_losses, want = _losses_and_grads(plain, *case)
    losses, got = _losses_and_grads(fused, *case)
    unpenalized, _ = _losses_and_grads(_plain, *case)
    assert abs(float(losses[0] - unpenalized[0])) > 1e-3
    np.testing.assert_allclose(losses.numpy(), want_losses.numpy(), rtol=1e-5)
    _assert_grads_close(got, want, rtol=1e-5)


def test_a_small_budget_means_many_chunks_and_the_same_result():
    case = _case(seed=3, vocab=64)
    want_losses, want = _losses_and_grads(_plain, *case)

    def tiny_budget(*args):
        return _fused(*args, chunk_bytes=1)  # one frame per chunk

    losses, got = _losses_and_grads(tiny_budget, *case)
    np.testing.assert_allclose(losses.numpy(), want_losses.numpy(), rtol=1e-5)
    _assert_grads_close(got, want, rtol=1e-5)


def test_xla_compiled_equals_eager():
    case = _case(seed=5)

    @tf.function(jit_compile=True, autograph=False)
    def compiled(*args):
        return _losses_and_grads(lambda *a: _fused(*a, chunk_frames=3), *args)

    losses, got = compiled(*case)
    want_losses, want = _losses_and_grads(_plain, *case)
    np.testing.assert_allclose(losses.numpy(), want_losses.numpy(), rtol=1e-5)
    _assert_grads_close(got, want, rtol=1e-5)


def test_mixed_float16_hidden_states_keep_float32_logits():
    enc, pred, kernel, bias, *rest = _case(seed=6)
    half = [tf.cast(enc, tf.float16), tf.cast(pred, tf.float16)]
    losses, grads = _losses_and_grads(_fused, *half, kernel, bias, *rest)
    want, _ = _losses_and_grads(_plain, *half, tf.cast(kernel, tf.float16),
                                tf.cast(bias, tf.float16), *rest)  # fmt: skip
    assert losses.dtype == tf.float32
    np.testing.assert_allclose(losses.numpy(), want.numpy(), rtol=2e-3)
    assert grads[0].dtype == tf.float16 and grads[2].dtype == tf.float32
    assert all(np.all(np.isfinite(tf.cast(g, tf.float32).numpy())) for g in grads)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_mixed_bfloat16_gradients_are_as_close_as_the_plain_layers(seed):
    """Under bfloat16 the joint's backward products run in bfloat16, as Keras' Dense layer
    runs them: every gradient stays as close to the float32 one (of the same rounded
    inputs) as the plain bfloat16 joint and loss come."""
    enc, pred, kernel, bias, *rest = _case(seed, frames=29, max_u=9, hidden=64, vocab=1024)
    low = [tf.cast(x, tf.bfloat16) for x in (enc, pred, kernel, bias)]
    exact = [tf.cast(x, tf.float32) for x in low]

    def gradients(loss_fn, *inputs):
        with tf.GradientTape() as tape:
            tape.watch(inputs)
            total = tf.reduce_sum(loss_fn(*inputs, *rest) * tf.constant([1.0, -0.5, 2.0]))
        return [tf.cast(g, tf.float32).numpy() for g in tape.gradient(total, inputs)]

    want = gradients(_plain, *exact)
    plain = gradients(_plain, *low)
    fused = gradients(_fused, low[0], low[1], exact[2], exact[3])  # float32 weights, cast inside
    for p, f, w in zip(plain, fused, want, strict=True):
        scale = np.max(np.abs(w))
        plain_error, fused_error = np.max(np.abs(p - w)) / scale, np.max(np.abs(f - w)) / scale
        assert fused_error <= max(1.5 * plain_error, 2**-8), (fused_error, plain_error)
        assert fused_error > 0  # the inputs' rounding shows: bfloat16 was computed


@pytest.mark.parametrize("kind", ["lstm", "conformer"])
def test_the_task_trains_the_same_fused_or_not(kind):
    """Every trainable variable's gradient through the whole transducer, fused vs not."""
    from asrkit.config import LossConfig, ModelConfig, PredictorConfig
    from asrkit.models.transducer import Transducer
    from asrkit.training.task import TransducerTask
    from tests.tiny import tiny_encoder

    config = ModelConfig(
        encoder=tiny_encoder(kind),
        predictor=PredictorConfig(embed_dim=8, units=16, dropout=0.0), joint_dim=16,
    )  # fmt: skip
    rng = np.random.default_rng(7)
    batch = (rng.standard_normal((3, 60, 80)).astype(np.float32), np.array([60, 41, 30]),
             np.array([[1, 2, 3, 4], [5, 6, 0, 0], [7, 0, 0, 0]], np.int32),
             np.array([4, 2, 0]))  # fmt: skip
    results = []
    for fused in (True, False):
        keras.utils.set_random_seed(0)
        task = TransducerTask(Transducer(12, config), LossConfig(fused=fused))
        with tf.GradientTape() as tape:
            loss_sum, _ = task.compute_loss_terms(batch, training=True)
        results.append((float(loss_sum), tape.gradient(loss_sum, task.trainable_variables)))
    (fused_loss, fused_grads), (plain_loss, plain_grads) = results
    assert fused_loss == pytest.approx(plain_loss, rel=1e-5)
    assert len(fused_grads) == len(plain_grads) > 10
    _assert_grads_close(fused_grads, plain_grads, rtol=1e-5)


def test_xla_with_unknown_shapes_picks_its_chunk_at_compile_time():
    """As in an XLA micro-step traced with relaxed shapes: the budget-derived chunk (and so
    the loop's sizes) must be resolvable when XLA compiles each concrete shape."""
    enc, pred, kernel, bias, labels, frame_lengths, label_lengths = _case(seed=8)
    spec = [tf.TensorSpec([None, None, None]), tf.TensorSpec([None, None, None]),
            tf.TensorSpec([None, None], tf.int32), tf.TensorSpec([None], tf.int32),
            tf.TensorSpec([None], tf.int32)]  # fmt: skip

    @tf.function(jit_compile=True, input_signature=spec, autograph=False)
    def compiled(enc, pred, labels, frame_lengths, label_lengths):
        return _losses_and_grads(
            lambda *a: _fused(*a, chunk_bytes=4096), enc, pred, kernel, bias,
            labels, frame_lengths, label_lengths,
        )  # fmt: skip

    losses, got = compiled(enc, pred, labels, frame_lengths, label_lengths)
    case = (enc, pred, kernel, bias, labels, frame_lengths, label_lengths)
    want_losses, want = _losses_and_grads(_plain, *case)
    np.testing.assert_allclose(losses.numpy(), want_losses.numpy(), rtol=1e-5)
    _assert_grads_close(got, want, rtol=1e-5)


def test_a_relu_joint_fused_equals_joint_then_loss():
    """NeMo's joint activation: the fused loss' hand-written gradient through ReLU equals
    TensorFlow's autodiff of relu(e + p) @ kernel + bias followed by the loss."""
    case = _case(seed=11)

    def plain(enc, pred, kernel, bias, labels, frame_lengths, label_lengths):
        logits = tf.matmul(tf.nn.relu(enc[:, :, None] + pred[:, None]), kernel) + bias
        return rnnt_loss(logits, labels, frame_lengths, label_lengths)

    def fused(*args):
        return _fused(*args, chunk_frames=4, activation="relu")

    want_losses, want = _losses_and_grads(plain, *case)
    losses, got = _losses_and_grads(fused, *case)
    np.testing.assert_allclose(losses.numpy(), want_losses.numpy(), rtol=1e-5)
    _assert_grads_close(got, want, rtol=1e-5)
    tanh_losses, _ = _losses_and_grads(_fused, *case)
    assert np.max(np.abs(tanh_losses.numpy() - losses.numpy())) > 0.1  # it is another joint
