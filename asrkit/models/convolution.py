"""The Conformer's convolution module: pre-norm, pointwise + GLU, depthwise convolution
over time, norm, swish, pointwise.

Padded frames are zeroed before the depthwise convolution, so an utterance's output is the
same alone or batched with longer ones. The norm is LayerNorm, or BatchNorm: from each
batch's statistics (`batch`: a micro-batch's output then depends on the other utterances
in it, so accumulated updates equal union-batch updates only approximately) or from its
running statistics, never updated (`frozen_batch`: exact; how an imported NeMo model is
fine-tuned).
"""

from __future__ import annotations

import keras
import tensorflow as tf

from asrkit.config import CONV_NORMS
from asrkit.models.fused import gated_unit, glu, layer_norm, residual_dropout
from asrkit.models.layers import (
    DEPTHWISE_DTYPE,
    BatchNorm,
    CompositeLayer,
    seed_or_zeros,
    seeded_dropout,
)

# What a convolution module sees: its centred kernel (full context), the kernel_size - 1
# frames before (causal), or its centred kernel up to the end of the frame's chunk.
MODULE_CONTEXTS = ("full", "causal", "chunk")


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
        use_bias: bool = True, epsilon: float = 1e-3, momentum: float = 0.99, **kwargs,
    ):  # fmt: skip
        super().__init__(**kwargs)
        if norm not in CONV_NORMS:
            raise ValueError(f"norm must be one of {CONV_NORMS}, got {norm!r}")
        if context not in MODULE_CONTEXTS:
            raise ValueError(f"context must be one of {MODULE_CONTEXTS}, got {context!r}")
        self.d_model, self.kernel_size, self.norm_type, self.dropout = (
            d_model, kernel_size, norm, dropout,
        )  # fmt: skip
        self.context, self.use_bias = context, use_bias
        self.epsilon, self.momentum = epsilon, momentum
        self.pre_norm = keras.layers.LayerNormalization(epsilon=epsilon)
        self.pointwise_in = keras.layers.Dense(2 * d_model, use_bias=use_bias)
        # Causal: the kernel_size - 1 frames before are padded by hand (same weights).
        self.depthwise = keras.layers.DepthwiseConv1D(
            kernel_size,
            padding="valid" if self.causal else "same",
            use_bias=use_bias,
            dtype=DEPTHWISE_DTYPE,
        )
        self.norm = (
            keras.layers.LayerNormalization(epsilon=epsilon) if norm == "layer"
            else BatchNorm(epsilon=epsilon, momentum=momentum)
        )  # fmt: skip
        self.pointwise_out = keras.layers.Dense(d_model, use_bias=use_bias)

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
        seed = seed_or_zeros(seed)
        return seeded_dropout(self._convolved(x, lengths, training, chunk), self.dropout,
                              seed, 0, training)  # fmt: skip

    def residual(self, x, lengths, training=False, seed=None, chunk=None):
        """x + this module's output."""
        out = self._convolved(x, lengths, training, chunk)
        return residual_dropout(x, out, 1.0, self.dropout, seed_or_zeros(seed), 0, training)

    def _convolved(self, x, lengths, training, chunk):
        """The module's output before its dropout."""
        normed = layer_norm(self.pre_norm, x, training)
        h = gated_unit(self.pointwise_in(normed), lengths, training)
        if self.causal:
            h = tf.pad(h, [[0, 0], [self.kernel_size - 1, 0], [0, 0]])
        out = tf.cast(self.depthwise(h), h.dtype)
        if self.chunked and chunk is not None:  # None: the utterance is one chunk
            out -= self._beyond_chunk(h, chunk)
        return self._finish(out, training)

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
        out = tf.cast(self.depthwise(padded), h.dtype)[:, start : start + tf.shape(x)[1]]
        if self.chunked:
            out -= self._beyond_chunk(new, chunk)
        return self._finish(out, False), new_tail

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
        return glu(self.pointwise_in(self.pre_norm(x)))

    def _finish(self, h, training):
        """Norm, swish, pointwise: the module's output before its dropout."""
        # frozen_batch: the running statistics, in training too (they never move).
        norm_training = training and self.norm_type != "frozen_batch"
        return self.pointwise_out(keras.activations.swish(self.norm(h, training=norm_training)))

    def get_config(self):
        return {
            **super().get_config(),
            "d_model": self.d_model,
            "kernel_size": self.kernel_size,
            "norm": self.norm_type,
            "dropout": self.dropout,
            "context": self.context,
            "use_bias": self.use_bias,
            "epsilon": self.epsilon,
            "momentum": self.momentum,
        }

    @property
    def causal(self) -> bool:
        return self.context == "causal"

    @property
    def chunked(self) -> bool:
        return self.context == "chunk"
