"""Self-attention with Transformer-XL relative positions (Dai et al. 2019), as NeMo's
Conformer computes it: what an imported NeMo encoder attends with.

For frames i (query) and j (key) of one head, with d_k-wide projections q, k and the
projected sinusoidal embedding p of the distance i - j:

    score(i, j) = ((q_i + u) · k_j + (q_i + v) · p_{i-j}) / sqrt(d_k)

`u` and `v` are learned per head (`pos_bias_u`, `pos_bias_v`). The distance term is
computed against all 2T - 1 distances T-1 .. -(T-1) at once and moved into place with the
pad-and-reshape "relative shift". Padded keys score -10000 and their attention weight is
then set to 0 (a query that is itself padding attends to nothing and gives the output
layer's bias).
"""

from __future__ import annotations

import math

import keras
import numpy as np
import tensorflow as tf

from asrkit.models.layers import CompositeLayer

_MASKED = -10000.0  # a padded key's score


def relative_embeddings(frames, d_model: int) -> tf.Tensor:
    """[2T - 1, d_model] sinusoidal embeddings of the distances T-1, T-2, .., -(T-1):
    sin at even and cos at odd features, frequencies 10000^(-2i/d)."""
    positions = tf.cast(tf.range(frames - 1, -frames, -1), tf.float32)[:, None]
    rates = np.exp(np.arange(0, d_model, 2) * -(math.log(10000.0) / d_model)).astype(np.float32)
    angles = positions * rates[None, :]  # [2T-1, d/2]
    return tf.reshape(tf.stack([tf.sin(angles), tf.cos(angles)], axis=-1), [-1, d_model])


def relative_shift(x: tf.Tensor) -> tf.Tensor:
    """[B, H, T, 2T-1] scores against the distances T-1 .. -(T-1) -> the same with row i
    shifted so that column j holds the score of distance i - j (its first T columns)."""
    shape = tf.shape(x)
    padded = tf.pad(x, [[0, 0], [0, 0], [0, 0], [1, 0]])  # [B, H, T, 2T]
    folded = tf.reshape(padded, [shape[0], shape[1], shape[3] + 1, shape[2]])
    return tf.reshape(folded[:, :, 1:], shape)


@keras.saving.register_keras_serializable(package="asrkit")
class RelPositionSelfAttention(CompositeLayer):
    """x [B, T, D], valid [B, T] bool -> [B, T, D]."""

    def __init__(self, *, d_model: int, num_heads: int, use_bias: bool = True, **kwargs):
        super().__init__(**kwargs)
        if d_model % num_heads:
            raise ValueError(f"d_model={d_model} must split into {num_heads} heads")
        self.d_model, self.num_heads, self.use_bias = d_model, num_heads, use_bias
        self.head_dim = d_model // num_heads
        self.query = keras.layers.Dense(d_model, use_bias=use_bias, name="query")
        self.key = keras.layers.Dense(d_model, use_bias=use_bias, name="key")
        self.value = keras.layers.Dense(d_model, use_bias=use_bias, name="value")
        self.position = keras.layers.Dense(d_model, use_bias=False, name="position")
        self.out = keras.layers.Dense(d_model, use_bias=use_bias, name="out")
        self.pos_bias_u = self.add_weight(
            shape=(num_heads, self.head_dim), initializer="zeros", name="pos_bias_u"
        )
        self.pos_bias_v = self.add_weight(
            shape=(num_heads, self.head_dim), initializer="zeros", name="pos_bias_v"
        )

    def _heads(self, x):
        """[B, T, D] -> [B, H, T, d_k]."""
        shape = tf.shape(x)
        return tf.transpose(
            tf.reshape(x, [shape[0], shape[1], self.num_heads, self.head_dim]), [0, 2, 1, 3]
        )

    def call(self, x, valid):
        frames = tf.shape(x)[1]
        q = self._heads(self.query(x))
        k, v = self._heads(self.key(x)), self._heads(self.value(x))
        p = self._heads(self.position(relative_embeddings(frames, self.d_model))[None])
        u = tf.cast(self.pos_bias_u, q.dtype)[None, :, None, :]
        w = tf.cast(self.pos_bias_v, q.dtype)[None, :, None, :]
        content = tf.matmul(q + u, k, transpose_b=True)  # [B, H, T, T]
        distance = relative_shift(tf.matmul(q + w, p, transpose_b=True))[..., :frames]
        scores = (content + distance) / math.sqrt(self.head_dim)
        keep = tf.logical_and(valid[:, None, :, None], valid[:, None, None, :])
        scores = tf.where(keep, scores, tf.cast(_MASKED, scores.dtype))
        weights = tf.where(keep, tf.nn.softmax(scores, axis=-1), tf.zeros_like(scores))
        attended = tf.transpose(tf.matmul(weights, v), [0, 2, 1, 3])  # [B, T, H, d_k]
        shape = tf.shape(x)
        return self.out(tf.reshape(attended, [shape[0], shape[1], self.d_model]))

    def get_config(self):
        return {
            **super().get_config(),
            "d_model": self.d_model,
            "num_heads": self.num_heads,
            "use_bias": self.use_bias,
        }
