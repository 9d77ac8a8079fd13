"""What every asrkit layer builds on: the composite-layer base and padding-safe masking."""

from __future__ import annotations

import keras
import tensorflow as tf


class CompositeLayer(keras.layers.Layer):
    """A layer made only of sub-layers, which build themselves on their first call."""

    def build(self, *args, **kwargs):
        self.built = True


def zero_padding(x, lengths):
    """x [B, T, ...] with every frame at t >= lengths[b] set to 0."""
    mask = tf.sequence_mask(lengths, tf.shape(x)[1], dtype=x.dtype)
    return x * tf.reshape(mask, tf.concat([tf.shape(mask), tf.ones([tf.rank(x) - 2], tf.int32)], 0))
