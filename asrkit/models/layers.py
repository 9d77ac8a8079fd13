"""What every asrkit layer builds on: the composite-layer base, padding-safe masking, and
dropout whose masks are a function of an explicit seed (so a recomputed block replays them)."""

from __future__ import annotations

import contextlib

import keras
import tensorflow as tf

# The dtype policy of depthwise convolutions, whatever the model's: under mixed bfloat16 the
# CPU kernels of their gradients are several times slower than in float32, and they are a
# sliver of a Conformer's products (tools/bench_throughput.py).
DEPTHWISE_DTYPE = "float32"


@contextlib.contextmanager
def dtype_policy(policy: str | None):
    """Keras' global dtype policy set to `policy` (None: left as it is) while the layers
    that take it are made, then set back."""
    previous = keras.mixed_precision.dtype_policy()
    if policy:
        keras.mixed_precision.set_dtype_policy(policy)
    try:
        yield
    finally:
        keras.mixed_precision.set_dtype_policy(previous)


class CompositeLayer(keras.layers.Layer):
    """A layer made only of sub-layers, which build themselves on their first call."""

    def build(self, *args, **kwargs):
        self.built = True


def seeded_dropout(x, rate: float, seed, salt: int, training: bool):
    """Dropout with the mask drawn from (seed, salt) alone: the same seed gives the same
    mask, which is what recomputing a block in the backward pass needs. `seed`: [2] int."""
    if not training or rate <= 0.0:
        return x
    key = tf.random.experimental.stateless_fold_in(tf.cast(seed, tf.int64), salt)
    return tf.nn.experimental.stateless_dropout(x, rate, seed=key)


def seed_or_zeros(seed):
    """A layer's dropout seed [2] int64 (an encoder passes one per block per call); a layer
    used on its own outside training may leave it out."""
    return tf.zeros([2], tf.int64) if seed is None else tf.cast(seed, tf.int64)


def block_seeds(generator: keras.random.SeedGenerator, training: bool):
    """One [2] seed per call for a stack of blocks; a constant when nothing draws from it
    (not training, or no dropout), so the generator only advances when masks are drawn."""
    if not training:
        return tf.zeros([2], tf.int64)
    return tf.cast(generator.next(), tf.int64)


def maybe_recomputed(fn, recompute: bool):
    """`fn` whose activations are recomputed in the backward pass instead of stored."""
    return tf.recompute_grad(fn) if recompute else fn


def zero_padding(x, lengths):
    """x [B, T, ...] with every frame at t >= lengths[b] set to 0. Selected, not multiplied
    by a 0/1 mask: the selection's gradient needs only the mask, where a product's keeps x
    alive for the backward pass (and padding that holds inf or NaN still comes out 0)."""
    mask = tf.sequence_mask(lengths, tf.shape(x)[1])
    mask = tf.reshape(mask, tf.concat([tf.shape(mask), tf.ones([tf.rank(x) - 2], tf.int32)], 0))
    return tf.where(mask, x, tf.zeros([], x.dtype))


def relu_keeping_signs(x):
    """ReLU whose backward pass keeps only where x > 0, one byte per value, instead of its
    output (TensorFlow's ReLU keeps the output for its gradient). For activations that
    nothing else keeps: the subsampling's, the largest of a Conformer's (a 114 M
    FastConformer on 4 x 20 s: [4, 1000, 40, 256] after its first convolution)."""

    @tf.custom_gradient
    def relu(x):
        positive = x > 0
        return tf.nn.relu(x), lambda upstream: tf.where(positive, upstream, 0.0)

    return relu(x)


@keras.saving.register_keras_serializable(package="asrkit")
class BatchNorm(keras.layers.BatchNormalization):
    """Keras' BatchNormalization, except that a training call on an empty batch (a replica's
    empty share of a small micro-batch) leaves the moving statistics as they were: Keras'
    own would average in the moments of no items, 0 / 0 = NaN, for good."""

    def call(self, inputs, training=None, mask=None):
        if not training:
            return super().call(inputs, training=training, mask=mask)
        moving = (self.moving_mean, self.moving_variance)
        before = [tf.identity(v.value) for v in moving]
        outputs = super().call(inputs, training=training, mask=mask)
        present = tf.shape(inputs)[0] > 0
        for variable, old in zip(moving, before, strict=True):
            variable.assign(tf.where(present, variable.value, old))
        return outputs
