"""The fused training pieces against their plain definitions: LayerNorm against NumPy and
Keras' own gradient, GLU and the dropout pieces against the unfused formula (with the same
mask) and its automatic gradient, the masks replayed from their seed, and a Conformer
block's training call without dropout against its inference call (the plain layers)."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from asrkit.models.conformer import ConformerBlock
from asrkit.models.fused import gated_unit, layer_norm, residual_dropout, swish_dropout
from tests.precision import assert_within_rounding, rounded_products, unit_roundoff

RNG = np.random.default_rng(3)
SEED = tf.constant([5, 9], tf.int64)


def _layer_norm(width, epsilon=1e-5):
    layer = keras.layers.LayerNormalization(epsilon=epsilon)
    layer.build((None, width))
    layer.gamma.assign(RNG.standard_normal(width).astype(np.float32))
    layer.beta.assign(RNG.standard_normal(width).astype(np.float32))
    return layer


def _gradients(fn, x, variables, upstream):
    with tf.GradientTape() as tape:
        tape.watch(x)
        y = fn(x)
        total = tf.reduce_sum(tf.cast(y, tf.float32) * upstream)
    return y, tape.gradient(total, [x, *variables])


def test_layer_norm_matches_numpy_forward_and_keras_gradients():
    layer = _layer_norm(24)
    x = tf.constant(RNG.standard_normal((3, 7, 24)).astype(np.float32) * 3 + 2)
    upstream = tf.constant(RNG.standard_normal((3, 7, 24)).astype(np.float32))
    weights = [layer.gamma, layer.beta]
    fused, fused_grads = _gradients(lambda v: layer_norm(layer, v, True), x, weights, upstream)
    plain, plain_grads = _gradients(layer, x, weights, upstream)
    x64 = x.numpy().astype(np.float64)
    normed = (x64 - x64.mean(-1, keepdims=True)) / np.sqrt(x64.var(-1, keepdims=True) + 1e-5)
    expected = normed * layer.gamma.numpy() + layer.beta.numpy()
    np.testing.assert_allclose(fused.numpy(), expected, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(plain.numpy(), expected, rtol=1e-5, atol=1e-5)
    for mine, keras_own in zip(fused_grads, plain_grads, strict=True):
        np.testing.assert_allclose(mine.numpy(), keras_own.numpy(), rtol=1e-4, atol=1e-5)
    # not training: Keras' layer itself
    np.testing.assert_array_equal(layer_norm(layer, x, False).numpy(), plain.numpy())


def test_layer_norm_in_bfloat16_computes_in_float32():
    layer = _layer_norm(32)
    x = RNG.standard_normal((2, 5, 32)).astype(np.float32) + 4
    y = layer_norm(layer, tf.cast(x, tf.bfloat16), True)
    assert y.dtype == tf.bfloat16
    rounded = tf.cast(tf.cast(x, tf.bfloat16), tf.float32)
    expected = layer_norm(layer, rounded, True)
    y = tf.cast(y, tf.float32).numpy()
    np.testing.assert_allclose(y, expected.numpy(), rtol=1e-2, atol=2e-2)


def _swish(x):
    return x * tf.sigmoid(x)


@pytest.mark.parametrize("rate", [0.1, 0.5])
def test_swish_dropout_is_the_plain_formula_with_its_mask(rate):
    x = tf.constant(RNG.standard_normal((4, 50, 64)).astype(np.float32))
    upstream = tf.constant(RNG.standard_normal((4, 50, 64)).astype(np.float32))
    y, (dx,) = _gradients(lambda v: swish_dropout(v, rate, SEED, 3, True), x, [], upstream)
    kept = y.numpy() != 0
    # the rate: within 5 standard deviations of a binomial draw
    n = kept.size
    assert abs((1 - kept.mean()) - rate) < 5 * np.sqrt(rate * (1 - rate) / n)
    scale = 1 / (1 - round(rate * 65536) / 65536)
    mask = tf.constant(kept.astype(np.float32))
    expected, (expected_dx,) = _gradients(lambda v: _swish(v) * scale * mask, x, [], upstream)
    np.testing.assert_allclose(y.numpy(), expected.numpy(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(dx.numpy(), expected_dx.numpy(), rtol=1e-5, atol=1e-6)
    # the same seed and salt: the same mask; another salt: another
    again = swish_dropout(x, rate, SEED, 3, True).numpy() != 0
    other = swish_dropout(x, rate, SEED, 4, True).numpy() != 0
    np.testing.assert_array_equal(again, kept)
    assert (other != kept).mean() > rate / 2
    # not training: swish alone
    np.testing.assert_allclose(swish_dropout(x, rate, SEED, 3, False), _swish(x), rtol=1e-6)


def test_residual_dropout_is_the_plain_formula_with_its_mask():
    x = tf.constant(RNG.standard_normal((3, 41, 16)).astype(np.float32))  # odd value count
    y = tf.constant(RNG.standard_normal((3, 41, 16)).astype(np.float32))
    upstream = tf.constant(RNG.standard_normal((3, 41, 16)).astype(np.float32))
    with tf.GradientTape() as tape:
        tape.watch([x, y])
        out = residual_dropout(x, y, 0.5, 0.2, SEED, 1, True)
        total = tf.reduce_sum(out * upstream)
    dx, dy = tape.gradient(total, [x, y])
    kept = (out - x).numpy() != 0
    scale = 0.5 / (1 - round(0.2 * 65536) / 65536)
    np.testing.assert_allclose(out.numpy(), x.numpy() + np.where(kept, y.numpy() * scale, 0),
                               rtol=1e-6, atol=1e-6)  # fmt: skip
    np.testing.assert_array_equal(dx.numpy(), upstream.numpy())
    np.testing.assert_allclose(dy.numpy(), np.where(kept, upstream.numpy() * scale, 0), rtol=1e-6)
    assert 0.1 < 1 - kept.mean() < 0.3
    np.testing.assert_allclose(residual_dropout(x, y, 0.5, 0.2, SEED, 1, False), x + 0.5 * y)


def test_gated_unit_is_glu_with_padding_zeroed_and_its_gradient():
    x = tf.constant(RNG.standard_normal((2, 9, 12)).astype(np.float32))
    lengths = tf.constant([9, 4])
    upstream = tf.constant(RNG.standard_normal((2, 9, 6)).astype(np.float32))
    real = (np.arange(9)[None, :] < lengths.numpy()[:, None])[:, :, None].astype(np.float32)

    def plain(v):
        return v[..., :6] * tf.sigmoid(v[..., 6:]) * real

    fused, (dx,) = _gradients(lambda v: gated_unit(v, lengths, True), x, [], upstream)
    expected, (expected_dx,) = _gradients(plain, x, [], upstream)
    np.testing.assert_allclose(fused.numpy(), expected.numpy(), rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(dx.numpy(), expected_dx.numpy(), rtol=1e-5, atol=1e-7)
    assert not dx.numpy()[1, 4:].any()  # padded frames get no gradient
    np.testing.assert_allclose(gated_unit(x, lengths, False), expected, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("precision", ["float32", "mixed_bfloat16"])
def test_a_block_trained_without_dropout_computes_what_its_inference_call_does(precision):
    keras.mixed_precision.set_global_policy(precision)
    try:
        block = ConformerBlock(
            d_model=32, num_heads=4, kernel_size=5, dropout=0.0, attention="relative",
            conv_norm="layer", out_norm=True, norm_epsilon=1e-5,
        )  # fmt: skip
        x = tf.constant(RNG.standard_normal((2, 11, 32)).astype(np.float32))
        lengths = tf.constant([11, 7])
        trained = tf.cast(block(x, lengths, training=True, seed=SEED), tf.float32)
        inferred = tf.cast(block(x, lengths, training=False), tf.float32)
    finally:
        keras.mixed_precision.set_global_policy("float32")
    if precision == "float32":
        np.testing.assert_allclose(trained.numpy(), inferred.numpy(), rtol=1e-5, atol=1e-5)
    else:  # two roundings of the same block, each within its bound of the exact result
        unit = 2 * unit_roundoff(precision)
        assert_within_rounding(trained, inferred, unit, rounded_products(block), "fused block")
