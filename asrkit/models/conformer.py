"""Conformer encoder: ×4 conv subsampling, then macaron blocks
(½ feed-forward, rotary multi-head self-attention, convolution module, ½ feed-forward).

Padding never leaks: attention masks padded keys, and padded frames are zeroed before every
convolution, so an utterance's encoder output is the same alone or batched with longer ones.
The convolution module normalises with LayerNorm by default; BatchNorm is an option, but its
batch statistics make a micro-batch's output depend on the other utterances in it, so with
BatchNorm, accumulated updates equal union-batch updates only approximately.
"""

from __future__ import annotations

import math

import keras
import tensorflow as tf

from asrkit.models.layers import (
    CompositeLayer,
    block_seeds,
    maybe_recomputed,
    seeded_dropout,
    zero_padding,
)
from asrkit.models.subsampling import ConvSubsampling


def rotary(x: tf.Tensor) -> tf.Tensor:
    """Rotary position embedding on [B, T, H, Dh] (positions 0..T-1, Dh even)."""
    frames, dim = tf.shape(x)[1], x.shape[-1]
    inv_freq = 1.0 / (10000.0 ** (tf.range(0, dim, 2, dtype=tf.float32) / dim))
    angles = tf.cast(tf.range(frames), tf.float32)[:, None] * inv_freq[None, :]  # [T, Dh/2]
    cos = tf.cast(tf.cos(angles), x.dtype)[None, :, None, :]
    sin = tf.cast(tf.sin(angles), x.dtype)[None, :, None, :]
    x1, x2 = x[..., : dim // 2], x[..., dim // 2 :]
    return tf.concat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], axis=-1)


def _seed(seed):
    """A block's dropout seed (the encoder passes one per block per call); a layer used on
    its own outside training may leave it out."""
    return tf.zeros([2], tf.int64) if seed is None else tf.cast(seed, tf.int64)


@keras.saving.register_keras_serializable(package="asrkit")
class RotarySelfAttention(CompositeLayer):
    def __init__(self, d_model: int, num_heads: int, dropout: float = 0.0, **kwargs):
        super().__init__(**kwargs)
        if d_model % num_heads or (d_model // num_heads) % 2:
            raise ValueError(f"d_model={d_model} must split into {num_heads} even-sized heads")
        self.d_model, self.num_heads, self.dropout = d_model, num_heads, dropout
        self.qkv = keras.layers.Dense(3 * d_model)
        self.out = keras.layers.Dense(d_model)

    def call(self, x, mask, training=False, seed=None):
        """x [B, T, D], mask [B, T] bool -> [B, T, D]; `seed` [2] draws the dropout masks."""
        batch, frames = tf.shape(x)[0], tf.shape(x)[1]
        head_dim = self.d_model // self.num_heads
        qkv = tf.reshape(self.qkv(x), [batch, frames, 3, self.num_heads, head_dim])
        q, k, v = rotary(qkv[:, :, 0]), rotary(qkv[:, :, 1]), qkv[:, :, 2]
        scores = tf.einsum("bthd,bshd->bhts", q, k)
        scores = tf.cast(scores, tf.float32) / math.sqrt(head_dim)
        scores = tf.where(mask[:, None, None, :], scores, -1e9)
        weights = tf.cast(tf.nn.softmax(scores, axis=-1), x.dtype)
        weights = seeded_dropout(weights, self.dropout, _seed(seed), 0, training)
        context = tf.einsum("bhts,bshd->bthd", weights, v)
        return self.out(tf.reshape(context, [batch, frames, self.d_model]))

    def get_config(self):
        return {
            **super().get_config(),
            "d_model": self.d_model,
            "num_heads": self.num_heads,
            "dropout": self.dropout,
        }


@keras.saving.register_keras_serializable(package="asrkit")
class FeedForward(CompositeLayer):
    def __init__(self, d_model: int, expansion: int = 4, dropout: float = 0.0, **kwargs):
        super().__init__(**kwargs)
        self.d_model, self.expansion, self.dropout = d_model, expansion, dropout
        self.norm = keras.layers.LayerNormalization()
        self.inner = keras.layers.Dense(d_model * expansion, activation="swish")
        self.outer = keras.layers.Dense(d_model)

    def call(self, x, training=False, seed=None):
        seed = _seed(seed)
        h = seeded_dropout(self.inner(self.norm(x)), self.dropout, seed, 0, training)
        return seeded_dropout(self.outer(h), self.dropout, seed, 1, training)

    def get_config(self):
        return {
            **super().get_config(),
            "d_model": self.d_model,
            "expansion": self.expansion,
            "dropout": self.dropout,
        }


@keras.saving.register_keras_serializable(package="asrkit")
class ConvolutionModule(CompositeLayer):
    def __init__(
        self, d_model: int, kernel_size: int = 15, norm: str = "layer", dropout=0.0, **kwargs
    ):
        super().__init__(**kwargs)
        if norm not in ("layer", "batch"):
            raise ValueError(f"norm must be 'layer' or 'batch', got {norm!r}")
        self.d_model, self.kernel_size, self.norm_type, self.dropout = (
            d_model, kernel_size, norm, dropout,
        )  # fmt: skip
        self.pre_norm = keras.layers.LayerNormalization()
        self.pointwise_in = keras.layers.Dense(2 * d_model)
        self.depthwise = keras.layers.DepthwiseConv1D(kernel_size, padding="same")
        self.norm = (
            keras.layers.LayerNormalization()
            if norm == "layer"
            else keras.layers.BatchNormalization()
        )
        self.pointwise_out = keras.layers.Dense(d_model)

    def call(self, x, lengths, training=False, seed=None):
        h = self.pointwise_in(self.pre_norm(x))
        h = h[..., : self.d_model] * tf.sigmoid(h[..., self.d_model :])  # GLU
        h = self.depthwise(zero_padding(h, lengths))
        h = keras.activations.swish(self.norm(h, training=training))
        return seeded_dropout(self.pointwise_out(h), self.dropout, _seed(seed), 0, training)

    def get_config(self):
        return {
            **super().get_config(),
            "d_model": self.d_model,
            "kernel_size": self.kernel_size,
            "norm": self.norm_type,
            "dropout": self.dropout,
        }


@keras.saving.register_keras_serializable(package="asrkit")
class ConformerBlock(CompositeLayer):
    def __init__(
        self,
        d_model: int,
        num_heads: int,
        kernel_size: int = 15,
        dropout: float = 0.1,
        conv_norm: str = "layer",
        **kwargs,
    ):
        super().__init__(**kwargs)
        self.d_model, self.num_heads, self.kernel_size = d_model, num_heads, kernel_size
        self.dropout, self.conv_norm = dropout, conv_norm
        self.ff1 = FeedForward(d_model, dropout=dropout)
        self.attn_norm = keras.layers.LayerNormalization()
        self.attention = RotarySelfAttention(d_model, num_heads, dropout)
        self.conv = ConvolutionModule(d_model, kernel_size, conv_norm, dropout)
        self.ff2 = FeedForward(d_model, dropout=dropout)
        self.out_norm = keras.layers.LayerNormalization()

    def call(self, x, lengths, training=False, seed=None):
        """x [B, T, D] -> [B, T, D]; every dropout mask is drawn from `seed` [2], so the
        block can be recomputed exactly in the backward pass."""
        seed = _seed(seed)

        def part(k):
            return tf.random.experimental.stateless_fold_in(seed, k)

        mask = tf.sequence_mask(lengths, tf.shape(x)[1])
        x = x + 0.5 * self.ff1(x, training=training, seed=part(1))
        attended = self.attention(self.attn_norm(x), mask, training=training, seed=part(2))
        x = x + seeded_dropout(attended, self.dropout, seed, 3, training)
        x = x + self.conv(x, lengths, training=training, seed=part(4))
        x = x + 0.5 * self.ff2(x, training=training, seed=part(5))
        return zero_padding(self.out_norm(x), lengths)

    def get_config(self):
        return {
            **super().get_config(),
            "d_model": self.d_model,
            "num_heads": self.num_heads,
            "kernel_size": self.kernel_size,
            "dropout": self.dropout,
            "conv_norm": self.conv_norm,
        }


@keras.saving.register_keras_serializable(package="asrkit")
class ConformerEncoder(CompositeLayer):
    """features [B, T, F], feature_lengths [B] -> encoder frames [B, T', D], encoder_lengths."""

    def __init__(
        self,
        d_model: int = 144,
        num_blocks: int = 16,
        num_heads: int = 4,
        kernel_size: int = 31,
        dropout: float = 0.1,
        conv_norm: str = "layer",
        subsampling_filters: int = 144,
        recompute: bool = False,
        **kwargs,
    ):
        super().__init__(**kwargs)
        self.d_model, self.num_blocks, self.num_heads = d_model, num_blocks, num_heads
        self.kernel_size, self.dropout, self.conv_norm = kernel_size, dropout, conv_norm
        self.subsampling_filters, self.recompute = subsampling_filters, recompute
        self.subsampling = ConvSubsampling(subsampling_filters, d_model)
        self.seeds = keras.random.SeedGenerator()
        self.blocks = [
            ConformerBlock(d_model, num_heads, kernel_size, dropout, conv_norm)
            for _ in range(num_blocks)
        ]

    @property
    def output_dim(self) -> int:
        return self.d_model

    def call(self, features, feature_lengths, training=False):
        x, lengths = self.subsampling(features, feature_lengths)
        # Drawn here, outside any recomputed block, so a recomputation replays the masks.
        seed = block_seeds(self.seeds, training and self.dropout > 0)
        x = seeded_dropout(x, self.dropout, seed, 0, training)
        for index, block in enumerate(self.blocks):
            block_seed = tf.random.experimental.stateless_fold_in(seed, index + 1)

            def run(x, block=block, block_seed=block_seed):
                return block(x, lengths, training=training, seed=block_seed)

            x = maybe_recomputed(run, self.recompute and training)(x)
        return x, lengths

    def get_config(self):
        return {
            **super().get_config(),
            "d_model": self.d_model,
            "num_blocks": self.num_blocks,
            "num_heads": self.num_heads,
            "kernel_size": self.kernel_size,
            "dropout": self.dropout,
            "conv_norm": self.conv_norm,
            "subsampling_filters": self.subsampling_filters,
            "recompute": self.recompute,
        }
