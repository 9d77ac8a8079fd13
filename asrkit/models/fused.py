"""A Conformer's elementwise work in training, each piece one XLA-compiled loop forward and
one backward, beside TensorFlow's own matrix products (which XLA on a CPU runs slower).

Four pieces, each with its gradient written out: LayerNorm (statistics in float32; the
backward pass keeps the input and two numbers per row), swish then dropout (a feed-forward's
inner activation), the convolution module's GLU with its padded frames zeroed, and a
residual sum `x + scale * dropout(y)`. Unfused, each is several TensorFlow kernels that
each read and write the whole tensor. Dropout masks come from 16 random bits per value
drawn by TensorFlow's stateless generator (XLA's own generator on a CPU is far slower) from
(seed, salt) alone, so a recomputed block replays them; the rate is rounded to 1/65536.

Used only in training calls: inference, streaming and export keep the plain layers, so an
exported model holds no XLA function.
"""

from __future__ import annotations

import tensorflow as tf

from asrkit.models.layers import zero_padding

_BITS = 65536  # a value is kept where its 16 random bits are >= rate * _BITS


def _threshold(rate: float) -> int:
    return round(rate * _BITS)


def keep_mask_bits(shape, seed, salt: int):
    """The random bits of a dropout mask over `shape`: [ceil(n / 2)] uint32, two values'
    16 bits each, from (seed [2], salt) alone."""
    count = tf.reduce_prod(shape)
    key = tf.random.experimental.stateless_fold_in(tf.cast(seed, tf.int64), salt)
    return tf.random.stateless_uniform(
        [(count + 1) // 2], key, minval=None, maxval=None, dtype=tf.uint32
    )


def _kept(bits, like, rate: float):
    """bool like `like`: the values the bits keep."""
    halves = tf.reshape(tf.bitcast(bits, tf.uint16), [-1])[: tf.size(like)]
    return tf.reshape(halves >= _threshold(rate), tf.shape(like))


def _kept_scale(rate: float) -> float:
    return _BITS / (_BITS - _threshold(rate))


@tf.function(jit_compile=True, autograph=False)
def _norm_forward(x, gamma, beta, epsilon):
    x32 = tf.cast(x, tf.float32)
    mean = tf.reduce_mean(x32, axis=-1, keepdims=True)
    centred = x32 - mean
    rstd = tf.math.rsqrt(tf.reduce_mean(tf.square(centred), axis=-1, keepdims=True) + epsilon)
    return tf.cast(centred * rstd * gamma + beta, x.dtype), mean, rstd


@tf.function(jit_compile=True, autograph=False)
def _norm_backward(x, gamma, mean, rstd, upstream):
    normed = (tf.cast(x, tf.float32) - mean) * rstd
    up = tf.cast(upstream, tf.float32)
    scaled = up * gamma
    dx = rstd * (
        scaled
        - tf.reduce_mean(scaled, axis=-1, keepdims=True)
        - normed * tf.reduce_mean(scaled * normed, axis=-1, keepdims=True)
    )
    axes = tf.range(tf.rank(x) - 1)
    return tf.cast(dx, x.dtype), tf.reduce_sum(up * normed, axes), tf.reduce_sum(up, axes)


def layer_norm(layer, x, training: bool):
    """`layer` (a Keras LayerNormalization over the last axis, with scale and centre) on
    x; fused in training."""
    if not training:
        return layer(x)
    if not layer.built:
        layer.build(x.shape)
    epsilon = tf.constant(layer.epsilon, tf.float32)

    @tf.custom_gradient
    def norm(x, gamma, beta):
        y, mean, rstd = _norm_forward(x, gamma, beta, epsilon)

        def grad(upstream):
            return _norm_backward(x, gamma, mean, rstd, upstream)

        return y, grad

    return norm(x, tf.convert_to_tensor(layer.gamma), tf.convert_to_tensor(layer.beta))


def swish_dropout(x, rate: float, seed, salt: int, training: bool):
    """dropout(swish(x)); fused in training with a rate > 0."""
    if not training or rate <= 0.0:
        return tf.nn.silu(x)
    bits = keep_mask_bits(tf.shape(x), seed, salt)

    @tf.custom_gradient
    def fused(x):
        y, keep = _swish_dropout_forward(x, bits, rate)
        return y, lambda upstream: _swish_dropout_backward(x, keep, upstream, rate)

    return fused(x)


@tf.function(jit_compile=True, autograph=False)
def _swish_dropout_forward(x, bits, rate):
    keep = _kept(bits, x, rate)
    scale = tf.cast(_kept_scale(rate), x.dtype)
    return tf.where(keep, tf.nn.silu(x) * scale, tf.zeros([], x.dtype)), keep


@tf.function(jit_compile=True, autograph=False)
def _swish_dropout_backward(x, keep, upstream, rate):
    x32 = tf.cast(x, tf.float32)
    s = tf.sigmoid(x32)
    slope = s * (1.0 + x32 * (1.0 - s)) * _kept_scale(rate)
    dx = tf.cast(tf.cast(upstream, tf.float32) * slope, x.dtype)
    return tf.where(keep, dx, tf.zeros([], x.dtype))


def glu(x):
    """The gated linear unit over the last axis of x [..., 2D] -> [..., D]: its first half
    times the sigmoid of its second."""
    values, gates = tf.split(x, 2, axis=-1)
    return values * tf.sigmoid(gates)


def gated_unit(x, lengths, training: bool):
    """`glu` of x [B, T, 2D] -> [B, T, D], frames at t >= lengths[b] zeroed; fused in
    training."""
    if not training:
        return zero_padding(glu(x), lengths)
    real = tf.sequence_mask(lengths, tf.shape(x)[1])

    @tf.custom_gradient
    def fused(x):
        return _glu_forward(x, real), lambda upstream: _glu_backward(x, real, upstream)

    return fused(x)


@tf.function(jit_compile=True, autograph=False)
def _glu_forward(x, real):
    return tf.where(real[:, :, None], glu(x), tf.zeros([], x.dtype))


@tf.function(jit_compile=True, autograph=False)
def _glu_backward(x, real, upstream):
    values, gates = tf.split(tf.cast(x, tf.float32), 2, axis=-1)
    up = tf.where(real[:, :, None], tf.cast(upstream, tf.float32), 0.0)
    s = tf.sigmoid(gates)
    return tf.cast(tf.concat([up * s, up * values * s * (1.0 - s)], axis=-1), x.dtype)


def residual_dropout(x, y, scale: float, rate: float, seed, salt: int, training: bool):
    """x + scale * dropout(y); fused in training with a rate > 0."""
    if not training or rate <= 0.0:
        return x + scale * y if scale != 1.0 else x + y
    bits = keep_mask_bits(tf.shape(y), seed, salt)

    @tf.custom_gradient
    def fused(x, y):
        out, keep = _residual_forward(x, y, bits, scale, rate)
        return out, lambda upstream: (upstream, _residual_backward(keep, upstream, scale, rate))

    return fused(x, y)


@tf.function(jit_compile=True, autograph=False)
def _residual_forward(x, y, bits, scale, rate):
    keep = _kept(bits, y, rate)
    factor = tf.cast(scale * _kept_scale(rate), y.dtype)
    return x + tf.where(keep, y * factor, tf.zeros([], y.dtype)), keep


@tf.function(jit_compile=True, autograph=False)
def _residual_backward(keep, upstream, scale, rate):
    factor = tf.cast(scale * _kept_scale(rate), upstream.dtype)
    return tf.where(keep, upstream * factor, tf.zeros([], upstream.dtype))
