"""The Conformer encoder: a subsampling, then macaron blocks (½ feed-forward, multi-head
self-attention, convolution module, ½ feed-forward), each module with its own pre-norm.

One encoder, its variants options (`asrkit.config.EncoderConfig`; docs/layout.md has the
table with NeMo's names): the attention's positions (rotary, or NeMo's relative positions),
the subsampling (asrkit's `valid` x4, NeMo's `striding` x4 or `dw_striding` x8), xscaling,
biases, the norms' epsilon, the convolution module's norm, the feed-forward width and where
the LayerNorm after the residual sums sits (`final_norm`): at the end of every block
("block", the paper and NeMo), once after the last block ("encoder") or nowhere ("none",
the config's default: a small Conformer with per-block norms stayed in the predictor-only
phase for most of the mini recipe's training, recipes/mini/README.md). An imported NeMo
model is this encoder with NeMo's options; NeMo's weight names stay in `asrkit.importers`.

Dropout (one rate, `dropout`) is drawn at NeMo's places: the frames after the subsampling,
inside each feed-forward after its activation, the attention weights, and each module's
output before its residual addition. Every mask comes from an explicit seed, so a
recomputed block replays it. In training the LayerNorms, the feed-forwards' swish and
dropout, the GLU and the residual sums run fused (`asrkit.models.fused`); inference runs
the plain layers.

Streaming (`chunk_frames` > 0, WeNet's chunk masks, NeMo's `chunked_limited` attention
context): encoder frames are grouped in chunks of `chunk_frames`; a frame attends to the
frames of its own chunk and of the `left_chunks` chunks before it (-1: all before), and the
convolution module sees its centred kernel up to the end of the frame's chunk
(`conv_context="chunk"`) or only the `kernel_size - 1` frames before (`"causal"`, which
trained far slower on the mini corpus). The `valid` subsampling needs 6 feature frames (60
ms) past the first of its 4. Then an utterance can be encoded chunk by chunk (`stream`,
`finish_stream`) with each block's keys/values of the history and its convolution's last
inputs kept as state, and the result is the same as one call on the whole utterance, with
either attention.

Padding never leaks: attention masks padded keys, padded frames are zeroed before every
convolution and after every block, so an utterance's encoder output is the same alone or
batched with longer ones.
"""

from __future__ import annotations

import math

import keras
import tensorflow as tf

from asrkit.config import CONV_CONTEXTS, FINAL_NORMS, EncoderConfig
from asrkit.features import halved_frames
from asrkit.models.attention import SelfAttention
from asrkit.models.convolution import ConvolutionModule
from asrkit.models.encoder import Encoder
from asrkit.models.fused import layer_norm, residual_dropout, swish_dropout
from asrkit.models.layers import (
    CompositeLayer,
    block_seeds,
    maybe_recomputed,
    seed_or_zeros,
    seeded_dropout,
    zero_padding,
)
from asrkit.models.linear_adapter import LinearAdapter
from asrkit.models.subsampling import (
    ConvSubsampling,
    StridingSubsampling,
    causal_window,
    subsample_piece,
)


def chunk_mask(query_positions, key_positions, chunk_frames: int, left_chunks: int):
    """[Tq, Tk] bool: may the frame at each query position attend to each key position —
    its own chunk and the `left_chunks` before it (-1: every chunk before)."""
    query_chunk = query_positions[:, None] // chunk_frames
    key_chunk = key_positions[None, :] // chunk_frames
    allowed = key_chunk <= query_chunk
    if not isinstance(left_chunks, int) or left_chunks >= 0:  # a tensor: a count >= 0
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


LOOKAHEAD_SEED = 0x100C  # with the update count: the stateless draw of each update


def lookahead_chunk_frames(updates, lookaheads: tuple[int, ...]):
    """The chunk (look-ahead + 1 frames) one update of a model of several look-aheads
    trains with (NeMo's multi look-ahead training, its att_context_probs uniform): one of
    `lookaheads`, uniformly, as a function of the optimizer's update count only — every
    micro-batch of a window and every replica train with the same, so accumulation stays
    exact, and a resumed run draws what it would have."""
    seed = tf.stack([tf.constant(LOOKAHEAD_SEED, tf.int64), tf.cast(updates, tf.int64)])
    index = tf.random.stateless_uniform([], seed, maxval=len(lookaheads), dtype=tf.int32)
    return tf.gather(tf.constant(lookaheads, tf.int32), index) + 1


@keras.saving.register_keras_serializable(package="asrkit")
class FeedForward(CompositeLayer):
    """Pre-norm, linear to expansion x d_model, swish, linear back."""

    def __init__(
        self, *, d_model: int, dropout: float, expansion: int = 4, use_bias: bool = True,
        epsilon: float = 1e-3, **kwargs,
    ):  # fmt: skip
        super().__init__(**kwargs)
        self.d_model, self.expansion, self.dropout = d_model, expansion, dropout
        self.use_bias, self.epsilon = use_bias, epsilon
        self.norm = keras.layers.LayerNormalization(epsilon=epsilon)
        self.inner = keras.layers.Dense(d_model * expansion, use_bias=use_bias)
        self.outer = keras.layers.Dense(d_model, use_bias=use_bias)

    def call(self, x, training=False, seed=None):
        seed = seed_or_zeros(seed)
        h = self._hidden(x, training, seed)
        return seeded_dropout(self.outer(h), self.dropout, seed, 1, training)

    def residual(self, x, training=False, seed=None):
        """x + ½ this module's output."""
        seed = seed_or_zeros(seed)
        h = self._hidden(x, training, seed)
        return residual_dropout(x, self.outer(h), 0.5, self.dropout, seed, 1, training)

    def _hidden(self, x, training, seed):
        inner = self.inner(layer_norm(self.norm, x, training))
        return swish_dropout(inner, self.dropout, seed, 0, training)

    def get_config(self):
        return {
            **super().get_config(),
            "d_model": self.d_model,
            "expansion": self.expansion,
            "dropout": self.dropout,
            "use_bias": self.use_bias,
            "epsilon": self.epsilon,
        }


# The block's options (besides d_model, num_heads, kernel_size, dropout), with the
# defaults of asrkit's own recipes.
BLOCK_OPTIONS = dict(
    attention=EncoderConfig.attention, conv_norm=EncoderConfig.conv_norm,
    conv_context="full", out_norm=False, ff_expansion=EncoderConfig.ff_expansion,
    use_bias=EncoderConfig.use_bias, norm_epsilon=EncoderConfig.norm_epsilon,
    batch_norm_momentum=EncoderConfig.batch_norm_momentum,
    attention_dropout=EncoderConfig.attention_dropout,  # None: the block's dropout
    adapter_dim=0,  # a linear adapter of this many units on the block's output (0: none)
)  # fmt: skip


@keras.saving.register_keras_serializable(package="asrkit")
class ConformerBlock(CompositeLayer):
    def __init__(
        self, *, d_model: int, num_heads: int, kernel_size: int, dropout: float, **options
    ):
        kwargs = {k: v for k, v in options.items() if k not in BLOCK_OPTIONS}
        super().__init__(**kwargs)
        self.d_model, self.num_heads, self.kernel_size = d_model, num_heads, kernel_size
        self.dropout = dropout
        self.options = {k: options.get(k, v) for k, v in BLOCK_OPTIONS.items()}
        o = self.options
        epsilon = o["norm_epsilon"]
        ff = dict(d_model=d_model, dropout=dropout, expansion=o["ff_expansion"],
                  use_bias=o["use_bias"], epsilon=epsilon)  # fmt: skip
        self.ff1 = FeedForward(**ff)
        self.attn_norm = keras.layers.LayerNormalization(epsilon=epsilon)
        attention_dropout = dropout if o["attention_dropout"] is None else o["attention_dropout"]
        self.attention = SelfAttention(
            d_model=d_model, num_heads=num_heads, dropout=attention_dropout,
            positions=o["attention"], use_bias=o["use_bias"],
        )  # fmt: skip
        self.conv = ConvolutionModule(
            d_model=d_model, kernel_size=kernel_size, norm=o["conv_norm"], dropout=dropout,
            context=o["conv_context"], use_bias=o["use_bias"], epsilon=epsilon,
            momentum=o["batch_norm_momentum"],
        )  # fmt: skip
        self.ff2 = FeedForward(**ff)
        # The LayerNorm at the end of every block (final_norm "block").
        self.out_norm = keras.layers.LayerNormalization(epsilon=epsilon) if o["out_norm"] else None
        self.adapter = (
            LinearAdapter(d_model=d_model, dim=o["adapter_dim"], epsilon=epsilon)
            if o["adapter_dim"] else None
        )  # fmt: skip

    def call(self, x, lengths, training=False, seed=None, allowed=None, chunk=None):
        """x [B, T, D] -> [B, T, D]; every dropout mask is drawn from `seed` [2], so the
        block can be recomputed exactly in the backward pass; `allowed` [T, T]: chunks;
        `chunk`: frames per chunk (a chunked convolution's bound)."""
        seed = seed_or_zeros(seed)

        def part(k):
            return tf.random.experimental.stateless_fold_in(seed, k)

        mask = tf.sequence_mask(lengths, tf.shape(x)[1])
        x = self.ff1.residual(x, training=training, seed=part(1))
        attended = self.attention(
            layer_norm(self.attn_norm, x, training), mask, training=training, seed=part(2),
            allowed=allowed,
        )  # fmt: skip
        x = residual_dropout(x, attended, 1.0, self.dropout, seed, 3, training)
        x = self.conv.residual(x, lengths, training=training, seed=part(4), chunk=chunk)
        x = self.ff2.residual(x, training=training, seed=part(5))
        return zero_padding(self._adapted(_normed(self.out_norm, x, training)), lengths)

    def _adapted(self, x):
        return x if self.adapter is None else self.adapter(x)

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
        return self._adapted(_normed(self.out_norm, x)), (keys, values, tail)

    def get_config(self):
        return {
            **super().get_config(),
            "d_model": self.d_model,
            "num_heads": self.num_heads,
            "kernel_size": self.kernel_size,
            "dropout": self.dropout,
            **self.options,
        }


# The encoder's options (besides the sizes), with their EncoderConfig defaults.
ENCODER_OPTIONS = (
    "attention", "subsampling", "subsampling_factor", "ff_expansion", "xscaling", "use_bias",
    "norm_epsilon", "batch_norm_momentum", "recompute", "chunk_frames", "left_chunks",
    "dynamic_chunks", "conv_context", "attention_dropout", "pre_encoder_dropout",
    "stochastic_depth", "stochastic_depth_mode", "stochastic_depth_start",
    "causal_subsampling", "lookaheads",
)  # fmt: skip


SKIP_SALT = 7777  # a block's skip draw: its seed folded with this, apart from its masks'


def skip_probabilities(blocks: int, probability: float, mode: str, start: int) -> list[float]:
    """Each block's probability of being skipped in training (stochastic depth): 0 for the
    blocks before `start` (1-based), then `probability` for all ("uniform") or rising in
    equal steps to it at the last block ("linear")."""
    rest = blocks - start
    if mode == "uniform":
        return [0.0] * start + [probability] * rest
    return [0.0] * start + [probability * k / rest for k in range(1, rest + 1)]


@keras.saving.register_keras_serializable(package="asrkit")
class ConformerEncoder(Encoder):
    """features [B, T, F], feature_lengths [B] -> encoder frames [B, T', D], encoder_lengths.
    Options not given take EncoderConfig's defaults (`ENCODER_OPTIONS`)."""

    def __init__(
        self, *, d_model: int, num_blocks: int, num_heads: int, kernel_size: int,
        dropout: float, conv_norm: str, subsampling_filters: int, final_norm: str,
        adapter_dim: int = 0, **options,
    ):  # fmt: skip
        """`adapter_dim` > 0: a linear adapter of that many units on every block (set from
        model.adapters kind linear, not model.encoder)."""
        kwargs = {k: v for k, v in options.items() if k not in ENCODER_OPTIONS}
        super().__init__(**kwargs)
        self.adapter_dim = adapter_dim
        if final_norm not in FINAL_NORMS:
            raise ValueError(f"final_norm must be one of {FINAL_NORMS}, got {final_norm!r}")
        o = {k: options.get(k, getattr(EncoderConfig, k)) for k in ENCODER_OPTIONS}
        if o["conv_context"] not in CONV_CONTEXTS:
            raise ValueError(
                f"conv_context must be one of {CONV_CONTEXTS}, got {o['conv_context']!r}"
            )
        self.sizes = dict(
            d_model=d_model, num_blocks=num_blocks, num_heads=num_heads,
            kernel_size=kernel_size, dropout=dropout, conv_norm=conv_norm,
            subsampling_filters=subsampling_filters, final_norm=final_norm,
        )  # fmt: skip
        self.options = o
        self.d_model, self.num_heads, self.dropout = d_model, num_heads, dropout
        self.recompute, self.xscaling = o["recompute"], o["xscaling"]
        self.pre_dropout = dropout if o["pre_encoder_dropout"] is None else o["pre_encoder_dropout"]
        self.skips = skip_probabilities(
            num_blocks,
            o["stochastic_depth"],
            o["stochastic_depth_mode"],
            o["stochastic_depth_start"],
        )
        rates = (dropout, self.pre_dropout, o["attention_dropout"] or 0.0, *self.skips)
        self.draws_masks = max(rates) > 0
        self.chunk_frames, self.left_chunks = o["chunk_frames"], o["left_chunks"]
        self.dynamic_chunks = o["dynamic_chunks"]
        if o["subsampling"] == "valid":
            self.subsampling = ConvSubsampling(filters=subsampling_filters, output_dim=d_model)
        else:
            self.subsampling = StridingSubsampling(
                kind=o["subsampling"], factor=o["subsampling_factor"],
                filters=subsampling_filters, output_dim=d_model,
                causal=bool(o["causal_subsampling"]),
            )  # fmt: skip
        self.lookaheads = tuple(o["lookaheads"])
        # NeMo's cache-aware streaming: the left context stays this many frames whatever
        # the look-ahead (-1: all).
        self.left_frames = self.left_chunks * self.chunk_frames if self.left_chunks >= 0 else -1
        self.seeds = keras.random.SeedGenerator()
        streaming = self.chunk_frames > 0 or self.dynamic_chunks > 0
        self.blocks = [
            ConformerBlock(
                d_model=d_model,
                num_heads=num_heads,
                kernel_size=kernel_size,
                dropout=dropout,
                attention=o["attention"],
                conv_norm=conv_norm,
                conv_context=o["conv_context"] if streaming else "full",
                out_norm=final_norm == "block",
                ff_expansion=o["ff_expansion"],
                use_bias=o["use_bias"],
                norm_epsilon=o["norm_epsilon"],
                batch_norm_momentum=o["batch_norm_momentum"],
                attention_dropout=o["attention_dropout"],
                adapter_dim=self.adapter_dim,
            )
            for _ in range(num_blocks)
        ]
        self.norm = (
            keras.layers.LayerNormalization(epsilon=o["norm_epsilon"])
            if final_norm == "encoder" else None
        )  # fmt: skip

    @property
    def output_dim(self) -> int:
        return self.d_model

    def _scaled(self, x):
        """Subsampled frames x sqrt(d_model) under xscaling (NeMo's Conformer)."""
        return x * math.sqrt(self.d_model) if self.xscaling else x

    def call(self, features, feature_lengths, training=False, chunk_frames=None):
        """`chunk_frames`: a scalar tensor that replaces the configured chunk size for this
        call (0: full context) — dynamic chunk training draws one per update, and so does
        training with several look-aheads (`lookahead_chunk_frames`)."""
        if features.shape[-1] is not None:
            self.feature_dim = int(features.shape[-1])  # a stream's feature buffer's width
        x, lengths = self.subsampling(features, feature_lengths, training=training)
        x = self._scaled(x)
        allowed = chunk = None
        positions = tf.range(tf.shape(x)[1])
        if chunk_frames is not None:
            chunk = tf.cast(chunk_frames, tf.int32)
            chunk = tf.where(chunk > 0, chunk, tf.maximum(tf.shape(x)[1], 1))  # 0: one chunk
            allowed = chunk_mask(positions, positions, chunk, self._left_chunks(chunk))
        elif self.chunk_frames:
            chunk = self.chunk_frames
            allowed = chunk_mask(positions, positions, chunk, self._left_chunks(chunk))
        # Drawn here, outside any recomputed block, so a recomputation replays the masks.
        seed = block_seeds(self.seeds, training and self.draws_masks)
        x = seeded_dropout(x, self.pre_dropout, seed, 0, training)
        for index, block in enumerate(self.blocks):
            block_seed = tf.random.experimental.stateless_fold_in(seed, index + 1)

            def run(x, block=block, block_seed=block_seed):
                return block(
                    x, lengths, training=training, seed=block_seed, allowed=allowed, chunk=chunk
                )

            skip = self.skips[index] if training else 0.0
            if skip:  # drawn outside the recomputed block, from its seed
                draw = tf.random.experimental.stateless_fold_in(block_seed, SKIP_SALT)
                kept = tf.random.stateless_uniform([], draw) >= skip
                y = maybe_recomputed(run, self.recompute and training)(x)
                # Skipped: x (the block's weights get zero gradients); kept: the change
                # scaled up, so the expected output is the block's.
                x = tf.where(kept, x + (y - x) / (1.0 - skip), x + 0.0 * y)
                continue
            x = maybe_recomputed(run, self.recompute and training)(x)
        return zero_padding(_normed(self.norm, x), lengths), lengths

    def _left_chunks(self, chunk):
        """The chunks to the left a frame attends to with chunks of `chunk` frames: the
        configured count, or for a model of several look-aheads as many as fill its left
        context in frames (NeMo's left context stays put when the look-ahead changes)."""
        if not self.lookaheads or self.left_frames < 0:
            return self.left_chunks
        return self.left_frames // chunk

    @property
    def streams(self) -> bool:
        return self.chunk_frames > 0

    @property
    def keeps_features(self) -> bool:
        """Does the stream state hold the features its subsampling still needs (a causal
        striding subsampling), so that a caller passes each feature frame once?"""
        return bool(getattr(self.subsampling, "causal", False))

    def initial_stream_state(self, batch_size):
        """(subsampled frames waiting for their chunk to fill, frames encoded so far, each
        block's (keys, values, convolution tail)[, a causal subsampling's (features it still
        needs, encoder frames made, feature frames seen)])."""
        head_dim = self.d_model // self.num_heads
        empty = tf.zeros([batch_size, 0, self.num_heads, head_dim], self.compute_dtype)
        tail_frames = self.blocks[0].conv.tail_frames
        tail = tf.zeros([batch_size, tail_frames, self.d_model], self.compute_dtype)
        pending = tf.zeros([batch_size, 0, self.d_model], self.compute_dtype)
        blocks = [(empty, empty, tail) for _ in self.blocks]
        if not self.keeps_features:
            return (pending, tf.constant(0, tf.int32), blocks)
        features = tf.zeros([batch_size, 0, self.feature_dim], tf.float32)
        return (pending, tf.constant(0, tf.int32), blocks,
                (features, tf.constant(0, tf.int32), tf.constant(0, tf.int32)))  # fmt: skip

    def stream(self, features, state):
        """The next feature frames of streams encoded up to here (as `LSTMEncoder.stream`)
        -> (the encoder frames of every chunk now complete, the new state). A chunk's frames
        attend to each other, so none leaves before its chunk is whole: `finish_stream`
        encodes the last, partial one."""
        pending, offset, blocks, *kept = state
        if kept:
            subsampled, sub = self._causal_subsampled(features, kept[0], last=False)
            kept = [sub]
        else:
            subsampled = subsample_piece(self.subsampling, features)
        x = tf.concat([pending, self._scaled(subsampled)], 1)
        ready = tf.shape(x)[1] // self.chunk_frames * self.chunk_frames
        out, state = self._stream_blocks(x[:, :ready], offset, blocks)
        return out, (x[:, ready:], *state, *kept)

    def finish_stream(self, state):
        """The end of the streams: the frames of the last, partial chunk."""
        pending, offset, blocks, *kept = state
        if kept:
            width = tf.shape(kept[0][0])
            nothing = tf.zeros([width[0], 0, width[2]], kept[0][0].dtype)
            subsampled, sub = self._causal_subsampled(nothing, kept[0], last=True)
            kept = [sub]
            pending = tf.concat([pending, self._scaled(subsampled)], 1)
        out, state = self._stream_blocks(pending, offset, blocks)
        return out, (pending[:, :0], *state, *kept)

    def _causal_subsampled(self, features, kept, last: bool):
        """The encoder frames the next features complete through a causal striding
        subsampling, as NeMo's cache-aware streaming buffer makes them: the first chunk's
        frames from the utterance's start (as the whole utterance's subsampling), the
        later ones from the features of 2 frames before them on, a shortfall before the
        start filled with frames of zeros; at the end (`last`) the frames padding
        completes, unless the features after the last whole chunk are fewer than the
        factor (NeMo's buffer drops those). -> (frames, the new kept state)."""
        raw, made, seen = kept
        factor = self.subsampling.factor
        raw = tf.concat([raw, tf.cast(features, raw.dtype)], axis=1)
        raw_start = tf.maximum(factor * (made - 2), 0)
        seen = seen + tf.shape(features)[1]
        complete = tf.where(seen > 0, (seen - 1) // factor + 1, 0)
        target = complete
        if last:
            first_chunk = 1 + factor * (self.chunk_frames - 1)  # NeMo's first chunk
            left = (seen - first_chunk) % (factor * self.chunk_frames)
            dropped = tf.logical_and(seen > first_chunk,
                                     tf.logical_and(left >= 1, left < factor))  # fmt: skip
            padded_count = halved_frames(seen, self.subsampling.halvings, True)
            target = tf.where(dropped, complete, padded_count)
        head_end = tf.minimum(target, self.chunk_frames)
        head = causal_window(self.subsampling, raw, raw_start, made, head_end, seen, True)
        rest_first = tf.maximum(made, self.chunk_frames)
        rest = causal_window(self.subsampling, raw, raw_start, rest_first, target, seen, False)
        frames = tf.concat([head, rest], axis=1)
        keep_from = tf.maximum(factor * (target - 2), 0)
        return frames, (raw[:, keep_from - raw_start :], target, seen)

    def _stream_blocks(self, x, offset, blocks):
        history = tf.shape(blocks[0][0])[1]
        positions = offset + tf.range(tf.shape(x)[1])
        keys_at = offset - history + tf.range(history + tf.shape(x)[1])
        left_chunks = self._left_chunks(self.chunk_frames)
        allowed = chunk_mask(positions, keys_at, self.chunk_frames, left_chunks)
        kept = []
        for block, state in zip(self.blocks, blocks, strict=True):
            x, (keys, values, tail) = block.stream(x, state, offset, allowed, self.chunk_frames)
            if left_chunks >= 0:  # only the chunks the next chunk may attend to
                start = tf.maximum(tf.shape(keys)[1] - left_chunks * self.chunk_frames, 0)
                keys, values = keys[:, start:], values[:, start:]
            kept.append((keys, values, tail))
        return _normed(self.norm, x), (offset + tf.shape(x)[1], kept)

    def get_config(self):
        return {**super().get_config(), **self.sizes, **self.options,
                "adapter_dim": self.adapter_dim}  # fmt: skip


def _normed(norm, x, training=False):
    """x through the optional final LayerNorm (`model.encoder.final_norm`)."""
    return x if norm is None else layer_norm(norm, x, training)
