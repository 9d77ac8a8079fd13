"""Multi-head self-attention of the Conformer, with rotary or relative positions.

* `rotary` — rotary position embeddings on queries and keys (asrkit's own recipes).
* `relative` — Transformer-XL relative positions (Dai et al. 2019) with untied per-head
  biases, as NeMo's Conformer attends (`self_attention_model: rel_pos`). For query frame i,
  key frame j and one head, with d_k-wide projections q, k and the projected sinusoidal
  embedding p of the distance i - j:

      score(i, j) = ((q_i + u) · k_j + (q_i + v) · p_{i-j}) / sqrt(d_k)

  On a whole utterance the distance term is computed against all 2T - 1 distances at once
  and moved into place with the pad-and-reshape relative shift; a stream's next frames,
  whose keys include a history, take each distance's column by index.

A key is attended to where it is a real frame (`mask`) and, narrower, where `allowed`
permits (chunks); a query with no key left gets zero weights (its output is the output
layer's bias), so padding never reaches a real frame. Queries, keys and values come from
one projection (`qkv`: [q | k | v]).
"""

from __future__ import annotations

import math

import keras
import numpy as np
import tensorflow as tf

from asrkit.models.layers import CompositeLayer, seed_or_zeros, seeded_dropout

POSITIONS = ("rotary", "relative")
_MASKED = -1e9  # a score that softmax turns into a weight of exactly 0 in float32


def rotary(x: tf.Tensor, offset=0) -> tf.Tensor:
    """Rotary position embedding on [B, T, H, Dh] (positions offset..offset+T-1, Dh even)."""
    frames, dim = tf.shape(x)[1], x.shape[-1]
    inv_freq = 1.0 / (10000.0 ** (tf.range(0, dim, 2, dtype=tf.float32) / dim))
    positions = tf.range(frames) + tf.cast(offset, tf.int32)
    angles = tf.cast(positions, tf.float32)[:, None] * inv_freq[None, :]  # [T, Dh/2]
    cos = tf.cast(tf.cos(angles), x.dtype)[None, :, None, :]
    sin = tf.cast(tf.sin(angles), x.dtype)[None, :, None, :]
    x1, x2 = x[..., : dim // 2], x[..., dim // 2 :]
    return tf.concat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], axis=-1)


def distance_embeddings(distances, d_model: int) -> tf.Tensor:
    """[N, d_model] sinusoidal embeddings of the int distances [N]: sin at even and cos at
    odd features, frequencies 10000^(-2i/d)."""
    positions = tf.cast(distances, tf.float32)[:, None]
    rates = np.exp(np.arange(0, d_model, 2) * -(math.log(10000.0) / d_model)).astype(np.float32)
    angles = positions * rates[None, :]  # [N, d/2]
    return tf.reshape(tf.stack([tf.sin(angles), tf.cos(angles)], axis=-1), [-1, d_model])


def relative_embeddings(frames, d_model: int) -> tf.Tensor:
    """[2T - 1, d_model]: the embeddings of the distances T-1, T-2, .., -(T-1)."""
    return distance_embeddings(_counting_down(frames - 1, 2 * frames - 1), d_model)


def _counting_down(top, count):
    """[count] int32: top, top - 1, ..; empty for a count <= 0 (no frames)."""
    return top - tf.range(tf.maximum(count, 0))


def relative_shift(x: tf.Tensor) -> tf.Tensor:
    """[B, H, T, 2T-1] scores against the distances T-1 .. -(T-1) -> the same with row i
    shifted so that column j holds the score of distance i - j (its first T columns)."""
    shape = tf.shape(x)
    padded = tf.pad(x, [[0, 0], [0, 0], [0, 0], [1, 0]])  # [B, H, T, 2T]
    folded = tf.reshape(padded, [shape[0], shape[1], shape[3] + 1, shape[2]])
    # tf.slice, not x[..]: its gradient is a pad, StridedSlice's a far slower scatter.
    return tf.reshape(tf.slice(folded, [0, 0, 1, 0], [-1, -1, -1, -1]), shape)


@keras.saving.register_keras_serializable(package="asrkit")
class SelfAttention(CompositeLayer):
    """x [B, T, D], mask [B, T] bool (real frames) -> [B, T, D]."""

    def __init__(
        self, *, d_model: int, num_heads: int, dropout: float, positions: str = "rotary",
        use_bias: bool = True, **kwargs,
    ):  # fmt: skip
        super().__init__(**kwargs)
        if positions not in POSITIONS:
            raise ValueError(f"positions must be one of {POSITIONS}, got {positions!r}")
        if d_model % num_heads or (positions == "rotary" and (d_model // num_heads) % 2):
            raise ValueError(f"d_model={d_model} must split into {num_heads} even-sized heads")
        self.d_model, self.num_heads, self.dropout = d_model, num_heads, dropout
        self.positions, self.use_bias = positions, use_bias
        self.head_dim = d_model // num_heads
        self.qkv = keras.layers.Dense(3 * d_model, use_bias=use_bias, name="qkv")
        self.out = keras.layers.Dense(d_model, use_bias=use_bias, name="out")
        if positions == "relative":
            self.position = keras.layers.Dense(d_model, use_bias=False, name="position")
            shape = (num_heads, self.head_dim)
            self.pos_bias_u = self.add_weight(shape=shape, initializer="zeros", name="pos_bias_u")
            self.pos_bias_v = self.add_weight(shape=shape, initializer="zeros", name="pos_bias_v")

    def call(self, x, mask, training=False, seed=None, allowed=None):
        """`allowed` [T, T] (query, key) narrows attention further (chunks); `seed` [2]
        draws the dropout masks of the attention weights."""
        q, k, v = self._project(x, 0)
        keep = mask[:, None, None, :]
        if allowed is not None:
            keep = tf.logical_and(keep, allowed[None, None])
        scores = self._content(q, k)
        if self.positions == "relative":
            frames = tf.shape(x)[1]
            by_distance = self._by_distance(q, relative_embeddings(frames, self.d_model))
            shifted = relative_shift(by_distance)
            scores += tf.slice(shifted, [0, 0, 0, 0], [-1, -1, -1, frames])
        return self._attend(scores, v, keep, training, seed)

    def stream(self, x, keys, values, offset, allowed):
        """The next frames of one stream: x [B, n, D] at positions offset.., with the
        history's keys/values [B, L, H, Dh] -> (out [B, n, D], keys and values of history +
        these frames). allowed [n, L + n]. Inference only."""
        q, k, v = self._project(x, offset)
        history = tf.shape(keys)[1]
        keys, values = tf.concat([keys, k], axis=1), tf.concat([values, v], axis=1)
        scores = self._content(q, keys)
        if self.positions == "relative":
            scores += self._stream_distances(q, history)
        return self._attend(scores, values, allowed[None, None], False, None), keys, values

    def _project(self, x, offset):
        batch, frames = tf.shape(x)[0], tf.shape(x)[1]
        # split, not strided slices (whose gradients scatter) nor unstack (LiteRT's fails on
        # a piece of no frames)
        shape = [batch, frames, self.num_heads, self.head_dim]
        q, k, v = (tf.reshape(p, shape) for p in tf.split(self.qkv(x), 3, axis=-1))
        if self.positions == "rotary":
            q, k = rotary(q, offset), rotary(k, offset)
        return q, k, v

    def _content(self, q, k):
        """[B, H, Tq, Tk] content scores (with the bias u under relative positions)."""
        if self.positions == "relative":
            q = q + tf.cast(self.pos_bias_u, q.dtype)
        return tf.cast(tf.einsum("bthd,bshd->bhts", q, k), tf.float32)

    def _by_distance(self, q, embeddings):
        """[B, H, Tq, N]: each query (with the bias v) against N distance embeddings."""
        p = tf.reshape(self.position(tf.cast(embeddings, self.compute_dtype)),
                       [-1, self.num_heads, self.head_dim])  # fmt: skip
        q = q + tf.cast(self.pos_bias_v, q.dtype)
        return tf.cast(tf.einsum("bthd,nhd->bhtn", q, p), tf.float32)

    def _stream_distances(self, q, history):
        """[B, H, n, L + n]: the distance term of n queries after L history keys. Query i
        and key j are L + i - j frames apart: from L + n - 1 down to -(n - 1)."""
        n = tf.shape(q)[1]
        distances = _counting_down(history + n - 1, history + 2 * n - 1)
        by_distance = self._by_distance(q, distance_embeddings(distances, self.d_model))
        # Column c holds distance L + n - 1 - c: (i, j) is column n - 1 - i + j.
        columns = (n - 1) - tf.range(n)[:, None] + tf.range(history + n)[None, :]
        return _take_per_row(by_distance, columns)

    def _attend(self, scores, v, keep, training, seed):
        batch, frames = tf.shape(scores)[0], tf.shape(scores)[2]
        scale = math.sqrt(self.head_dim)
        weights = (masked_softmax_trained if training else masked_softmax)(scores, keep, scale)
        weights = seeded_dropout(
            tf.cast(weights, v.dtype), self.dropout, seed_or_zeros(seed), 0, training
        )
        context = tf.einsum("bhts,bshd->bthd", weights, v)
        return self.out(tf.reshape(context, [batch, frames, self.d_model]))

    def get_config(self):
        return {
            **super().get_config(),
            "d_model": self.d_model,
            "num_heads": self.num_heads,
            "dropout": self.dropout,
            "positions": self.positions,
            "use_bias": self.use_bias,
        }


def masked_softmax(scores, keep, scale: float):
    """Attention weights from float32 scores [B, H, Tq, Tk]: the softmax over the keys of
    scores / scale where `keep` (broadcast to the scores), exactly 0 elsewhere and on a
    query with no key kept."""
    weights = tf.nn.softmax(tf.where(keep, scores / scale, _MASKED), axis=-1)
    return tf.where(keep, weights, 0.0)


def masked_softmax_trained(scores, keep, scale: float):
    """`masked_softmax` with its gradient written out: the backward pass keeps only the
    weights (which the product with the values keeps anyway), where differentiating the
    ops would also keep the scores and the softmax's own copy of the weights: two
    [B, H, Tq, Tk] float32 tensors per block fewer (a 114 M FastConformer on 4 x 20 s:
    17 blocks x 2 x 7.6 MiB)."""

    @tf.custom_gradient
    def weighted(scores):
        weights = masked_softmax(scores, keep, scale)

        def grad(upstream):
            upstream = tf.cast(upstream, weights.dtype)
            inner = tf.reduce_sum(upstream * weights, axis=-1, keepdims=True)
            # masked keys have weight 0, so their scores get no gradient
            return weights * (upstream - inner) / scale

        return weights, grad

    return weighted(scores)


def _take_per_row(x, columns):
    """x [B, H, n, W], columns [n, K] -> [B, H, n, K]: row i's columns[i]."""
    shape = tf.shape(x)
    rows = tf.reshape(tf.transpose(x, [2, 0, 1, 3]), [shape[2], -1, shape[3]])  # [n, B*H, W]
    taken = tf.gather(rows, columns, axis=2, batch_dims=1)  # [n, B*H, K]
    return tf.transpose(
        tf.reshape(taken, [shape[2], shape[0], shape[1], tf.shape(columns)[1]]), [1, 2, 0, 3]
    )
