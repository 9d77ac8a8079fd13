"""Convolutional time subsampling of the encoders (frame arithmetic:
`asrkit.features.encoder_frames`).

* `valid` (`ConvSubsampling`, asrkit's ×4): two 3×3 convolutions with stride 2 and *valid*
  padding: output frame t always sees input frames [4t, 4t+6], whatever the padded length,
  so padding never shifts or leaks into an utterance's frames (TF's "same" padding would,
  depending on the padded length's parity), and a stream can be subsampled piece by piece.
* `striding` and `dw_striding` (`StridingSubsampling`, NeMo's Conformer ×4 and
  FastConformer ×8): per halving a 3×3 stride-2 convolution padded by 1 on each side
  (`dw_striding`: after the first, a depthwise 3×3 stride-2 and a pointwise convolution),
  each + ReLU, the time axis masked to each layer's valid length before every layer,
  channels × frequency flattened channel-major into a linear layer. Valid frames:
  (n + 2 - 3) // 2 + 1 per halving. `causal` (NeMo's causal_downsampling): each
  convolution padded by 2 before and 1 after instead, in time and frequency, so output
  frame k sees input frames up to factor × k only (n // 2 + 1 frames per halving);
  `causal_window` subsamples a stream's next frames from a few frames before them, as
  NeMo's cache-aware streaming does.
"""

from __future__ import annotations

import math

import keras
import tensorflow as tf

from asrkit.features import MIN_FEATURE_FRAMES, conv_frames, encoder_frames, halved_frames
from asrkit.models.layers import DEPTHWISE_DTYPE, CompositeLayer, relu_keeping_signs, zero_padding

STRIDINGS = ("striding", "dw_striding")


@keras.saving.register_keras_serializable(package="asrkit")
class ConvSubsampling(CompositeLayer):
    """[B, T, F] features -> [B, T', D] with T' = encoder_frames(T)."""

    def __init__(self, *, filters: int, output_dim: int, **kwargs):
        super().__init__(**kwargs)
        self.filters = filters
        self.output_dim = output_dim
        self.conv1 = keras.layers.Conv2D(filters, 3, strides=2, padding="valid", activation="relu")
        self.conv2 = keras.layers.Conv2D(filters, 3, strides=2, padding="valid", activation="relu")
        self.project = keras.layers.Dense(output_dim)

    def call(self, features, lengths, training=False):
        """`training`: unused (the convolutions' own ReLUs)."""
        # TF's Conv2D fails on an empty batch, which is what a replica gets as its share of a
        # global micro-batch smaller than the replica count: one silent row is always
        # appended and sliced off again (no tf.cond, so XLA still knows every shape).
        batch = tf.shape(features)[0]
        silent_row = tf.zeros(tf.concat([[1], tf.shape(features)[1:]], 0), features.dtype)
        features = tf.concat([features, silent_row], axis=0)
        lengths = tf.concat([lengths, tf.zeros([1], lengths.dtype)], axis=0)
        x = tf.expand_dims(zero_padding(features, lengths), -1)  # [B+1, T, F, 1]
        x = self.conv1(x)
        x = zero_padding(x, conv_frames(lengths))
        x = self.conv2(x)
        shape = tf.shape(x)
        x = tf.reshape(x, [shape[0], shape[1], x.shape[2] * x.shape[3]])
        out_lengths = encoder_frames(lengths)
        return zero_padding(self.project(x), out_lengths)[:batch], out_lengths[:batch]

    def get_config(self):
        return {**super().get_config(), "filters": self.filters, "output_dim": self.output_dim}


def subsample_piece(subsampling: ConvSubsampling, features):
    """The encoder frames of the next piece of streams: features [B, F, mel], all real,
    starting at 4 × the frames made so far (F may be < 7) -> [B, encoder_frames(F), D]. The
    caller keeps the features from 4 × (frames returned) on for the next piece."""
    batch, frames = tf.shape(features)[0], tf.shape(features)[1]
    # Too few frames for the convolutions: zero frames after the real ones change only
    # encoder frames past encoder_frames(F), which are cut off.
    short = tf.maximum(MIN_FEATURE_FRAMES - frames, 0)
    features = tf.pad(features, [[0, 0], [0, short], [0, 0]])
    x, lengths = subsampling(features, tf.fill([batch], frames))
    return x[:, : lengths[0]]


def _halvings(factor: int) -> int:
    halvings = round(math.log2(factor))
    if 2**halvings != factor or halvings < 1:
        raise ValueError(f"subsampling factor must be a power of 2, got {factor}")
    return halvings


def _conv(conv, x):
    """A subsampling convolution (3x3 stride 2 valid, or pointwise); for an empty batch (a
    replica's empty share) zeros of the output shape: TensorFlow's CPU kernels give
    tensors of the wrong shape for no items."""
    shape = tf.shape(x)
    channels = getattr(conv, "filters", None) or x.shape[3]
    size, stride = conv.kernel_size[0], conv.strides[0]

    def empty():
        out = [0, (shape[1] - size) // stride + 1, (shape[2] - size) // stride + 1, channels]
        return tf.zeros(tf.stack(out), x.dtype)

    y = tf.cond(shape[0] > 0, lambda: tf.cast(conv(x), x.dtype), empty)
    return tf.ensure_shape(y, [x.shape[0], None, None, channels])  # batch stays static


@keras.saving.register_keras_serializable(package="asrkit")
class StridingSubsampling(CompositeLayer):
    """features [B, T, F], lengths -> [B, T', output_dim], lengths' (NeMo's `striding` or
    `dw_striding` by `factor`, a power of 2)."""

    def __init__(
        self, *, kind: str, factor: int, filters: int, output_dim: int, causal: bool = False,
        **kwargs,
    ):  # fmt: skip
        super().__init__(**kwargs)
        if kind not in STRIDINGS:
            raise ValueError(f"subsampling must be one of {STRIDINGS}, got {kind!r}")
        self.kind, self.factor, self.filters, self.output_dim = kind, factor, filters, output_dim
        self.causal = causal
        self.halvings = _halvings(factor)
        conv = lambda: keras.layers.Conv2D(filters, 3, strides=2, padding="valid")  # noqa: E731
        if kind == "striding":
            self.convs = [conv() for _ in range(self.halvings)]
            self.pointwise = []
        else:
            self.convs = [conv()] + [
                keras.layers.DepthwiseConv2D(3, strides=2, padding="valid", dtype=DEPTHWISE_DTYPE)
                for _ in range(self.halvings - 1)
            ]
            self.pointwise = [keras.layers.Conv2D(filters, 1) for _ in range(self.halvings - 1)]
        self.out = keras.layers.Dense(output_dim, name="out")

    def call(self, features, lengths, valid_from=0, streams=False, training=False):
        """`valid_from`: the leading input frames that stand for padding before the
        utterance (zeroed at every layer's input, as the convolutions' own padding would
        be); a multiple of the factor. `streams`: never an empty batch (a stream's step),
        so no guard for one (LiteRT has none of its ops). `training`: ReLUs whose backward
        pass keeps one byte per value (the same values)."""
        conv_of = (lambda conv, x: tf.cast(conv(x), x.dtype)) if streams else _conv
        relu = relu_keeping_signs if training else tf.nn.relu
        x = tf.expand_dims(features, -1)  # [B, T, F, 1]: time and frequency as image axes
        pad = [[0, 0], [2, 1], [2, 1], [0, 0]] if self.causal else [[0, 0], [1, 1], [1, 1], [0, 0]]
        for i, conv in enumerate(self.convs):
            x = _from(zero_padding(x, lengths), valid_from // 2**i)
            x = conv_of(conv, tf.pad(x, pad))
            lengths = halved_frames(lengths, 1, self.causal)
            if self.kind == "dw_striding" and i > 0:
                x = conv_of(self.pointwise[i - 1], zero_padding(x, lengths))
            x = relu(x)
        x = _from(zero_padding(x, lengths), valid_from // self.factor)
        shape = tf.shape(x)  # [B, T', F', C] -> channel-major [B, T', C * F']
        x = tf.reshape(tf.transpose(x, [0, 1, 3, 2]), [shape[0], shape[1], -1])
        return self.out(x), lengths

    def get_config(self):
        return {**super().get_config(), "kind": self.kind, "factor": self.factor,
                "filters": self.filters, "output_dim": self.output_dim,
                "causal": self.causal}  # fmt: skip


def _from(x, first):
    """x [B, T, ...] with its frames before `first` zeroed."""
    if isinstance(first, int) and first == 0:
        return x
    keep = tf.range(tf.shape(x)[1]) >= first
    return tf.where(tf.reshape(keep, [1, -1] + [1] * (x.shape.rank - 2)), x, tf.zeros_like(x))


def causal_window(subsampling: StridingSubsampling, raw, raw_start, first, end, stop, padded):
    """Encoder frames [first, end) of one stream through a causal striding subsampling,
    as NeMo's cache-aware streaming makes them: from the features of 2 frames before
    `first` on (`raw` [B, n, mel] holds the features from index `raw_start` on), up to
    feature `stop` (exclusive); the first 2 frames made are dropped. Features before the
    utterance's start count as padding (`padded`: what the whole utterance's subsampling
    gives) or as frames of zeros (NeMo's pre-encode cache for chunks after the first).
    -> [B, end - first, D]."""
    factor = subsampling.factor
    start = factor * (first - 2)  # the window's first feature, a multiple of the factor
    before = tf.maximum(-start, 0)  # features before the utterance: zero rows in front
    window = raw[:, tf.maximum(start, 0) - raw_start : stop - raw_start]
    window = tf.pad(window, [[0, 0], [before, 0], [0, 0]])
    rows = tf.shape(window)[1]
    x, _ = subsampling(window, tf.fill([tf.shape(raw)[0]], rows),
                       valid_from=before if padded else 0, streams=True)  # fmt: skip
    return x[:, 2 : 2 + tf.maximum(end - first, 0)]
