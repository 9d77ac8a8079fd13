"""Conformer encoder: ×4 conv subsampling, then macaron blocks
(½ feed-forward, rotary multi-head self-attention, convolution module, ½ feed-forward), each
module with its own pre-norm. `final_norm` places the LayerNorm after the residual sums: at
the end of every block as in the Conformer paper ("block"), once after the last block
("encoder"), or nowhere ("none", the config's default: a small Conformer with per-block
norms stayed in the predictor-only phase for most of the mini recipe's training; without
them it learns the corpus faster than the LSTM, recipes/mini/README.md).

Streaming (`chunk_frames` > 0, WeNet's chunk masks): encoder frames are grouped in chunks of
`chunk_frames`; a frame attends to the frames of its own chunk and of the `left_chunks`
chunks before it (-1: all before), and the convolution module sees its centred kernel up to
the end of the frame's chunk (`conv_context="chunk"`) or only the `kernel_size - 1` frames
before (`"causal"`, which trained far slower on the mini corpus). The subsampling needs 6
feature frames (60 ms) past the first of its 4. Then an utterance can be encoded chunk by
chunk (`stream`, `finish_stream`) with each block's keys/values of the history and its
convolution's last inputs kept as state, and the result is the same as one call on the
whole utterance.

Padding never leaks: attention masks padded keys, and padded frames are zeroed before every
convolution, so an utterance's encoder output is the same alone or batched with longer ones.
The convolution module normalises with LayerNorm by default; BatchNorm is an option, but its
batch statistics make a micro-batch's output depend on the other utterances in it, so with
`conv_norm="batch"`, accumulated updates equal union-batch updates only approximately;
`"frozen_batch"` normalises with the running statistics (never updated), which keeps
accumulation exact and is how an imported model is fine-tuned.
"""

from __future__ import annotations

import math

import keras
import tensorflow as tf

from asrkit.config import CONV_CONTEXTS, CONV_NORMS, FINAL_NORMS, EncoderConfig
from asrkit.models.layers import (
    BatchNorm,
    CompositeLayer,
    block_seeds,
    maybe_recomputed,
    seeded_dropout,
    zero_padding,
)
from asrkit.models.subsampling import ConvSubsampling, subsample_piece

# What a convolution module sees: its centred kernel (full context), the kernel_size - 1
# frames before (causal), or its centred kernel up to the end of the frame's chunk.
MODULE_CONTEXTS = ("full", "causal", "chunk")


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


def chunk_mask(query_positions, key_positions, chunk_frames: int, left_chunks: int):
    """[Tq, Tk] bool: may the frame at each query position attend to each key position —
    its own chunk and the `left_chunks` before it (-1: every chunk before)."""
    query_chunk = query_positions[:, None] // chunk_frames
    key_chunk = key_positions[None, :] // chunk_frames
    allowed = key_chunk <= query_chunk
    if left_chunks >= 0:
        allowed = tf.logical_and(allowed, key_chunk >= query_chunk - left_chunks)
    return allowed


DYNAMIC_CHUNK_SEED = 0x5EED  # with the update count: the stateless draw of each update


def dynamic_chunk_frames(updates, max_frames: int):
    """The chunk size one update trains with (WeNet's dynamic chunk training): 0 (full
    context) for half of the updates, else uniform in 1..`max_frames`. A function of the
    optimizer's update count only, so every micro-batch of a window and every replica use
    the same chunks (accumulation stays exact) and a resumed run draws what it would have."""
    seed = tf.stack([tf.constant(DYNAMIC_CHUNK_SEED, tf.int64), tf.cast(updates, tf.int64)])
    draw = tf.random.stateless_uniform([], seed, maxval=2 * max_frames, dtype=tf.int32)
    return tf.where(draw < max_frames, draw + 1, 0)


def _seed(seed):
    """A block's dropout seed (the encoder passes one per block per call); a layer used on
    its own outside training may leave it out."""
    return tf.zeros([2], tf.int64) if seed is None else tf.cast(seed, tf.int64)


@keras.saving.register_keras_serializable(package="asrkit")
class RotarySelfAttention(CompositeLayer):
    def __init__(self, *, d_model: int, num_heads: int, dropout: float, **kwargs):
        super().__init__(**kwargs)
        if d_model % num_heads or (d_model // num_heads) % 2:
            raise ValueError(f"d_model={d_model} must split into {num_heads} even-sized heads")
        self.d_model, self.num_heads, self.dropout = d_model, num_heads, dropout
        self.qkv = keras.layers.Dense(3 * d_model)
        self.out = keras.layers.Dense(d_model)

    def call(self, x, mask, training=False, seed=None, allowed=None):
        """x [B, T, D], mask [B, T] bool (real frames) -> [B, T, D]; `allowed` [T, T]
        (query, key) narrows attention further (chunks); `seed` [2] draws dropout masks."""
        q, k, v = self._project(x, 0)
        keep = mask[:, None, None, :]
        if allowed is not None:
            keep = tf.logical_and(keep, allowed[None, None])
        return self._attend(q, k, v, keep, training, seed)

    def stream(self, x, keys, values, offset, allowed):
        """The next frames of one stream: x [B, n, D] at positions offset.., with the
        history's keys/values [B, L, H, Dh] -> (out [B, n, D], keys and values of history +
        these frames). allowed [n, L + n]. Inference only."""
        q, k, v = self._project(x, offset)
        keys, values = tf.concat([keys, k], axis=1), tf.concat([values, v], axis=1)
        return self._attend(q, keys, values, allowed[None, None], False, None), keys, values

    def _project(self, x, offset):
        batch, frames = tf.shape(x)[0], tf.shape(x)[1]
        head_dim = self.d_model // self.num_heads
        qkv = tf.reshape(self.qkv(x), [batch, frames, 3, self.num_heads, head_dim])
        return rotary(qkv[:, :, 0], offset), rotary(qkv[:, :, 1], offset), qkv[:, :, 2]

    def _attend(self, q, k, v, keep, training, seed):
        batch, frames = tf.shape(q)[0], tf.shape(q)[1]
        scores = tf.einsum("bthd,bshd->bhts", q, k)
        scores = tf.cast(scores, tf.float32) / math.sqrt(self.d_model // self.num_heads)
        scores = tf.where(keep, scores, -1e9)
        weights = tf.cast(tf.nn.softmax(scores, axis=-1), q.dtype)
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
    def __init__(self, *, d_model: int, dropout: float, expansion: int = 4, **kwargs):
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
    """Pre-norm, pointwise + GLU, depthwise convolution over time, norm, swish, pointwise.

    The depthwise convolution sees `kernel_size` frames centred on each frame, unless
    `context` is "causal" (the `kernel_size - 1` frames before and the frame itself) or
    "chunk" (the centred frames up to the end of the frame's chunk: the chunk's own
    look-ahead, which a streaming encoder waits for anyway, and never a later chunk; `call`
    takes the chunk size).
    """

    def __init__(
        self, *, d_model: int, kernel_size: int, norm: str, dropout: float, context: str,
        **kwargs,
    ):  # fmt: skip
        super().__init__(**kwargs)
        if norm not in CONV_NORMS:
            raise ValueError(f"norm must be one of {CONV_NORMS}, got {norm!r}")
        if context not in MODULE_CONTEXTS:
            raise ValueError(f"context must be one of {MODULE_CONTEXTS}, got {context!r}")
        self.d_model, self.kernel_size, self.norm_type, self.dropout = (
            d_model, kernel_size, norm, dropout,
        )  # fmt: skip
        self.context = context
        self.pre_norm = keras.layers.LayerNormalization()
        self.pointwise_in = keras.layers.Dense(2 * d_model)
        # Causal: the kernel_size - 1 frames before are padded by hand (same weights).
        self.depthwise = keras.layers.DepthwiseConv1D(
            kernel_size, padding="valid" if self.causal else "same"
        )
        self.norm = keras.layers.LayerNormalization() if norm == "layer" else BatchNorm()
        self.pointwise_out = keras.layers.Dense(d_model)

    @property
    def _left(self) -> int:
        """Frames before a frame the centred ("same") convolution sees."""
        return (self.kernel_size - 1) // 2

    @property
    def tail_frames(self) -> int:
        """Gated frames a stream keeps from one piece for the next."""
        return self.kernel_size - 1 if self.causal else self._left

    def call(self, x, lengths, training=False, seed=None, chunk=None):
        """x [B, T, D] -> [B, T, D]; `chunk`: frames per chunk (a chunked module only; None:
        the whole utterance is one chunk — a dynamic-chunk model run at full context)."""
        h = zero_padding(self._gated(x), lengths)
        if self.causal:
            h = tf.pad(h, [[0, 0], [self.kernel_size - 1, 0], [0, 0]])
        out = self.depthwise(h)
        if self.chunked and chunk is not None:  # None: the utterance is one chunk
            out -= self._beyond_chunk(h, chunk)
        return self._finish(out, training, seed)

    def stream(self, x, tail, chunk=None):
        """Causal or chunked: the next frames x [B, n, D] after the previous `tail_frames`
        frames' gated inputs `tail` -> (out [B, n, D], the new tail). Chunked: x starts at
        a chunk's first frame and holds whole chunks (or the stream's last, partial one).
        Inference only."""
        new = self._gated(x)
        h = tf.concat([tail, new], axis=1)
        new_tail = h[:, tf.shape(h)[1] - self.tail_frames :]
        # One zero frame after: a piece of no frames still convolves (its output is cut).
        padded = tf.pad(h, [[0, 0], [0, 1], [0, 0]])
        start = 0 if self.causal else self._left  # "same": outputs aligned with h's frames
        out = self.depthwise(padded)[:, start : start + tf.shape(x)[1]]
        if self.chunked:
            out -= self._beyond_chunk(new, chunk)
        return self._finish(out, False, None), new_tail

    def _beyond_chunk(self, h, chunk):
        """What the centred convolution of h [B, T, D] (chunks starting at frame 0) took
        from frames past each output frame's chunk: the taps to subtract."""
        frames = tf.shape(h)[1]
        within = tf.range(frames) % tf.cast(chunk, tf.int32)  # each frame's place in its chunk
        kernel = tf.cast(self.depthwise.kernel, h.dtype)  # [kernel_size, D, 1]
        right = self.kernel_size - 1 - self._left  # frames after a frame the kernel sees
        padded = tf.pad(h, [[0, 0], [0, right], [0, 0]])
        removed = tf.zeros_like(h)
        for ahead in range(1, right + 1):
            later = padded[:, ahead : ahead + frames]
            past_end = tf.cast(within + ahead >= chunk, h.dtype)[None, :, None]
            removed += later * kernel[self._left + ahead, :, 0] * past_end
        return removed

    def _gated(self, x):
        h = self.pointwise_in(self.pre_norm(x))
        return h[..., : self.d_model] * tf.sigmoid(h[..., self.d_model :])  # GLU

    def _finish(self, h, training, seed):
        # frozen_batch: the running statistics, in training too (they never move).
        norm_training = training and self.norm_type != "frozen_batch"
        h = keras.activations.swish(self.norm(h, training=norm_training))
        return seeded_dropout(self.pointwise_out(h), self.dropout, _seed(seed), 0, training)

    def get_config(self):
        return {
            **super().get_config(),
            "d_model": self.d_model,
            "kernel_size": self.kernel_size,
            "norm": self.norm_type,
            "dropout": self.dropout,
            "context": self.context,
        }

    @property
    def causal(self) -> bool:
        return self.context == "causal"

    @property
    def chunked(self) -> bool:
        return self.context == "chunk"


@keras.saving.register_keras_serializable(package="asrkit")
class ConformerBlock(CompositeLayer):
    def __init__(
        self,
        *,
        d_model: int,
        num_heads: int,
        kernel_size: int,
        dropout: float,
        conv_norm: str,
        conv_context: str,
        out_norm: bool,
        **kwargs,
    ):
        super().__init__(**kwargs)
        self.d_model, self.num_heads, self.kernel_size = d_model, num_heads, kernel_size
        self.dropout, self.conv_norm, self.conv_context = dropout, conv_norm, conv_context
        self.ff1 = FeedForward(d_model=d_model, dropout=dropout)
        self.attn_norm = keras.layers.LayerNormalization()
        self.attention = RotarySelfAttention(d_model=d_model, num_heads=num_heads, dropout=dropout)
        self.conv = ConvolutionModule(
            d_model=d_model, kernel_size=kernel_size, norm=conv_norm, dropout=dropout,
            context=conv_context,
        )  # fmt: skip
        self.ff2 = FeedForward(d_model=d_model, dropout=dropout)
        # The Conformer paper's LayerNorm at the end of every block (see ConformerEncoder).
        self.out_norm = keras.layers.LayerNormalization() if out_norm else None

    def call(self, x, lengths, training=False, seed=None, allowed=None, chunk=None):
        """x [B, T, D] -> [B, T, D]; every dropout mask is drawn from `seed` [2], so the
        block can be recomputed exactly in the backward pass; `allowed` [T, T]: chunks;
        `chunk`: frames per chunk (a chunked convolution's bound)."""
        seed = _seed(seed)

        def part(k):
            return tf.random.experimental.stateless_fold_in(seed, k)

        mask = tf.sequence_mask(lengths, tf.shape(x)[1])
        x = x + 0.5 * self.ff1(x, training=training, seed=part(1))
        attended = self.attention(
            self.attn_norm(x), mask, training=training, seed=part(2), allowed=allowed
        )
        x = x + seeded_dropout(attended, self.dropout, seed, 3, training)
        x = x + self.conv(x, lengths, training=training, seed=part(4), chunk=chunk)
        x = x + 0.5 * self.ff2(x, training=training, seed=part(5))
        return zero_padding(_normed(self.out_norm, x), lengths)

    def stream(self, x, state, offset, allowed, chunk=None):
        """The next frames of one stream (see `ConformerEncoder.stream`): state = (keys,
        values, convolution tail) -> (out, the state with these frames appended)."""
        keys, values, tail = state
        x = x + 0.5 * self.ff1(x)
        attended, keys, values = self.attention.stream(
            self.attn_norm(x), keys, values, offset, allowed
        )
        x = x + attended
        convolved, tail = self.conv.stream(x, tail, chunk)
        x = x + convolved
        x = x + 0.5 * self.ff2(x)
        return _normed(self.out_norm, x), (keys, values, tail)

    def get_config(self):
        return {
            **super().get_config(),
            "d_model": self.d_model,
            "num_heads": self.num_heads,
            "kernel_size": self.kernel_size,
            "dropout": self.dropout,
            "conv_norm": self.conv_norm,
            "conv_context": self.conv_context,
            "out_norm": self.out_norm is not None,
        }


@keras.saving.register_keras_serializable(package="asrkit")
class ConformerEncoder(CompositeLayer):
    """features [B, T, F], feature_lengths [B] -> encoder frames [B, T', D], encoder_lengths."""

    def __init__(
        self,
        *,
        d_model: int,
        num_blocks: int,
        num_heads: int,
        kernel_size: int,
        dropout: float,
        conv_norm: str,
        subsampling_filters: int,
        final_norm: str,
        recompute: bool = EncoderConfig.recompute,
        chunk_frames: int = EncoderConfig.chunk_frames,
        left_chunks: int = EncoderConfig.left_chunks,
        dynamic_chunks: int = EncoderConfig.dynamic_chunks,
        conv_context: str = EncoderConfig.conv_context,
        **kwargs,
    ):
        super().__init__(**kwargs)
        if final_norm not in FINAL_NORMS:
            raise ValueError(f"final_norm must be one of {FINAL_NORMS}, got {final_norm!r}")
        if conv_context not in CONV_CONTEXTS:
            raise ValueError(f"conv_context must be one of {CONV_CONTEXTS}, got {conv_context!r}")
        self.d_model, self.num_blocks, self.num_heads = d_model, num_blocks, num_heads
        self.kernel_size, self.dropout, self.conv_norm = kernel_size, dropout, conv_norm
        self.subsampling_filters, self.recompute = subsampling_filters, recompute
        self.chunk_frames, self.left_chunks = chunk_frames, left_chunks
        self.dynamic_chunks, self.final_norm = dynamic_chunks, final_norm
        self.conv_context = conv_context
        self.subsampling = ConvSubsampling(filters=subsampling_filters, output_dim=d_model)
        self.seeds = keras.random.SeedGenerator()
        streaming = chunk_frames > 0 or dynamic_chunks > 0
        self.blocks = [
            ConformerBlock(
                d_model=d_model,
                num_heads=num_heads,
                kernel_size=kernel_size,
                dropout=dropout,
                conv_norm=conv_norm,
                conv_context=conv_context if streaming else "full",
                out_norm=final_norm == "block",
            )
            for _ in range(num_blocks)
        ]
        self.norm = keras.layers.LayerNormalization() if final_norm == "encoder" else None

    @property
    def output_dim(self) -> int:
        return self.d_model

    def call(self, features, feature_lengths, training=False, chunk_frames=None):
        """`chunk_frames`: a scalar tensor that replaces the configured chunk size for this
        call (0: full context) — dynamic chunk training draws one per update."""
        x, lengths = self.subsampling(features, feature_lengths)
        allowed = chunk = None
        positions = tf.range(tf.shape(x)[1])
        if chunk_frames is not None:
            chunk = tf.cast(chunk_frames, tf.int32)
            chunk = tf.where(chunk > 0, chunk, tf.maximum(tf.shape(x)[1], 1))  # 0: one chunk
            allowed = chunk_mask(positions, positions, chunk, self.left_chunks)
        elif self.chunk_frames:
            chunk = self.chunk_frames
            allowed = chunk_mask(positions, positions, chunk, self.left_chunks)
        # Drawn here, outside any recomputed block, so a recomputation replays the masks.
        seed = block_seeds(self.seeds, training and self.dropout > 0)
        x = seeded_dropout(x, self.dropout, seed, 0, training)
        for index, block in enumerate(self.blocks):
            block_seed = tf.random.experimental.stateless_fold_in(seed, index + 1)

            def run(x, block=block, block_seed=block_seed):
                return block(
                    x, lengths, training=training, seed=block_seed, allowed=allowed, chunk=chunk
                )

            x = maybe_recomputed(run, self.recompute and training)(x)
        return zero_padding(_normed(self.norm, x), lengths), lengths

    @property
    def streams(self) -> bool:
        return self.chunk_frames > 0

    def initial_stream_state(self, batch_size):
        """(subsampled frames waiting for their chunk to fill, frames encoded so far, each
        block's (keys, values, convolution tail))."""
        head_dim = self.d_model // self.num_heads
        empty = tf.zeros([batch_size, 0, self.num_heads, head_dim], self.compute_dtype)
        tail_frames = self.blocks[0].conv.tail_frames
        tail = tf.zeros([batch_size, tail_frames, self.d_model], self.compute_dtype)
        pending = tf.zeros([batch_size, 0, self.d_model], self.compute_dtype)
        blocks = [(empty, empty, tail) for _ in self.blocks]
        return (pending, tf.constant(0, tf.int32), blocks)

    def stream(self, features, state):
        """The next feature frames of streams encoded up to here (as `LSTMEncoder.stream`)
        -> (the encoder frames of every chunk now complete, the new state). A chunk's frames
        attend to each other, so none leaves before its chunk is whole: `finish_stream`
        encodes the last, partial one."""
        pending, offset, blocks = state
        x = tf.concat([pending, subsample_piece(self.subsampling, features)], axis=1)
        ready = tf.shape(x)[1] // self.chunk_frames * self.chunk_frames
        out, state = self._stream_blocks(x[:, :ready], offset, blocks)
        return out, (x[:, ready:], *state)

    def finish_stream(self, state):
        """The end of the streams: the frames of the last, partial chunk."""
        pending, offset, blocks = state
        out, state = self._stream_blocks(pending, offset, blocks)
        return out, (pending[:, :0], *state)

    def _stream_blocks(self, x, offset, blocks):
        history = tf.shape(blocks[0][0])[1]
        positions = offset + tf.range(tf.shape(x)[1])
        keys_at = offset - history + tf.range(history + tf.shape(x)[1])
        allowed = chunk_mask(positions, keys_at, self.chunk_frames, self.left_chunks)
        kept = []
        for block, state in zip(self.blocks, blocks, strict=True):
            x, (keys, values, tail) = block.stream(x, state, offset, allowed, self.chunk_frames)
            if self.left_chunks >= 0:  # only the chunks the next chunk may attend to
                start = tf.maximum(tf.shape(keys)[1] - self.left_chunks * self.chunk_frames, 0)
                keys, values = keys[:, start:], values[:, start:]
            kept.append((keys, values, tail))
        return _normed(self.norm, x), (offset + tf.shape(x)[1], kept)

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
            "chunk_frames": self.chunk_frames,
            "left_chunks": self.left_chunks,
            "dynamic_chunks": self.dynamic_chunks,
            "final_norm": self.final_norm,
            "conv_context": self.conv_context,
        }


def _normed(norm, x):
    """x through the optional final LayerNorm (`model.encoder.final_norm`)."""
    return x if norm is None else norm(x)
