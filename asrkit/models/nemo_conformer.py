"""NeMo's Conformer and FastConformer encoders in Keras: the architecture an imported
NeMo transducer's weights belong to (written from the papers and NeMo's code, equal to NeMo's
output on its own checkpoints — tests/models/test_nemo_conformer.py).

* Subsampling (`striding`, x4: two 3x3 stride-2 convolutions padded by 1, each + ReLU;
  `dw_striding`, x8 FastConformer: a 3x3 stride-2 convolution + ReLU, then per further
  halving a depthwise 3x3 stride-2 and a pointwise convolution + ReLU), the time axis masked
  to each layer's valid length before every layer, channels x frequency flattened
  channel-major into a linear layer to d_model. Valid frames: (n + 2 - 3) // 2 + 1 per
  halving.
* xscaling (x * sqrt(d_model), Conformer only), then `num_layers` blocks: ½ feed-forward
  (swish), relative-position self-attention (`rel_attention`), the convolution module
  (pointwise to 2d, GLU, padded frames zeroed, depthwise of `kernel_size`, BatchNorm,
  swish, pointwise), ½ feed-forward, each with its own pre-LayerNorm, and a LayerNorm
  after the block (`norm_out`). LayerNorm and BatchNorm epsilons are torch's (1e-5).

BatchNorm normalises with its running statistics unless `batch_norm_statistics` is
"batch" (training from batch statistics, which breaks exact accumulation). `dropout` is
NeMo's residual dropout (on each module's output before its residual addition); NeMo's
attention-weight and pre-encoder dropouts are not modelled (0 in inference anyway).
"""

from __future__ import annotations

import math

import keras
import tensorflow as tf

from asrkit.features import halved_frames
from asrkit.models.layers import (
    BatchNorm,
    CompositeLayer,
    block_seeds,
    maybe_recomputed,
    seeded_dropout,
)
from asrkit.models.rel_attention import RelPositionSelfAttention

SUBSAMPLINGS = ("striding", "dw_striding")
_EPSILON = 1e-5  # torch's LayerNorm and BatchNorm default


def _halvings(factor: int) -> int:
    halvings = round(math.log2(factor))
    if 2**halvings != factor or halvings < 1:
        raise ValueError(f"subsampling factor must be a power of 2, got {factor}")
    return halvings


def _time_mask(x, lengths):
    """x [B, T, ...] with frames t >= lengths zeroed."""
    mask = tf.sequence_mask(lengths, tf.shape(x)[1], dtype=x.dtype)
    return x * tf.reshape(mask, tf.concat([tf.shape(mask), tf.ones([tf.rank(x) - 2], tf.int32)], 0))


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

    y = tf.cond(shape[0] > 0, lambda: conv(x), empty)
    return tf.ensure_shape(y, [x.shape[0], None, None, channels])  # batch stays static


@keras.saving.register_keras_serializable(package="asrkit")
class NemoSubsampling(CompositeLayer):
    """features [B, T, F], lengths -> [B, T', d_model], lengths'."""

    def __init__(self, *, kind: str, factor: int, channels: int, d_model: int, **kwargs):
        super().__init__(**kwargs)
        if kind not in SUBSAMPLINGS:
            raise ValueError(f"subsampling must be one of {SUBSAMPLINGS}, got {kind!r}")
        self.kind, self.factor, self.channels, self.d_model = kind, factor, channels, d_model
        self.halvings = _halvings(factor)
        conv = lambda: keras.layers.Conv2D(channels, 3, strides=2, padding="valid")  # noqa: E731
        if kind == "striding":
            self.convs = [conv() for _ in range(self.halvings)]
            self.pointwise = []
        else:
            self.convs = [conv()] + [
                keras.layers.DepthwiseConv2D(3, strides=2, padding="valid")
                for _ in range(self.halvings - 1)
            ]
            self.pointwise = [keras.layers.Conv2D(channels, 1) for _ in range(self.halvings - 1)]
        self.out = keras.layers.Dense(d_model, name="out")

    def call(self, features, lengths):
        x = features[..., None]  # [B, T, F, 1]: time and frequency as the image axes
        for i, conv in enumerate(self.convs):
            x = _time_mask(x, lengths)
            x = tf.pad(x, [[0, 0], [1, 1], [1, 1], [0, 0]])
            x = _conv(conv, x)
            lengths = halved_frames(lengths, 1)
            if self.kind == "dw_striding" and i > 0:
                x = _conv(self.pointwise[i - 1], _time_mask(x, lengths))
            x = tf.nn.relu(x)
        x = _time_mask(x, lengths)
        shape = tf.shape(x)  # [B, T', F', C] -> channel-major [B, T', C * F']
        x = tf.reshape(tf.transpose(x, [0, 1, 3, 2]), [shape[0], shape[1], -1])
        return self.out(x), lengths

    def get_config(self):
        return {**super().get_config(), "kind": self.kind, "factor": self.factor,
                "channels": self.channels, "d_model": self.d_model}  # fmt: skip


@keras.saving.register_keras_serializable(package="asrkit")
class NemoFeedForward(CompositeLayer):
    def __init__(self, *, d_model: int, expansion: int, use_bias: bool = True, **kwargs):
        super().__init__(**kwargs)
        self.d_model, self.expansion, self.use_bias = d_model, expansion, use_bias
        self.inner = keras.layers.Dense(d_model * expansion, use_bias=use_bias, name="inner")
        self.outer = keras.layers.Dense(d_model, use_bias=use_bias, name="outer")

    def call(self, x):
        return self.outer(keras.activations.silu(self.inner(x)))

    def get_config(self):
        return {**super().get_config(), "d_model": self.d_model, "expansion": self.expansion,
                "use_bias": self.use_bias}  # fmt: skip


@keras.saving.register_keras_serializable(package="asrkit")
class NemoConvolution(CompositeLayer):
    def __init__(
        self, *, d_model: int, kernel_size: int, batch_norm_statistics: str,
        use_bias: bool = True, **kwargs,
    ):  # fmt: skip
        super().__init__(**kwargs)
        if kernel_size % 2 == 0:
            raise ValueError(f"the convolution kernel must be odd, got {kernel_size}")
        self.d_model, self.kernel_size, self.use_bias = d_model, kernel_size, use_bias
        self.batch_norm_statistics = batch_norm_statistics
        self.pointwise_in = keras.layers.Dense(2 * d_model, use_bias=use_bias, name="pointwise_in")
        self.depthwise = keras.layers.DepthwiseConv1D(
            kernel_size, padding="same", use_bias=use_bias
        )
        self.norm = BatchNorm(epsilon=_EPSILON, momentum=0.9)
        self.pointwise_out = keras.layers.Dense(d_model, use_bias=use_bias, name="pointwise_out")

    def call(self, x, lengths, training=False):
        h = self.pointwise_in(x)
        h = h[..., : self.d_model] * tf.sigmoid(h[..., self.d_model :])  # GLU
        h = self.depthwise(_time_mask(h, lengths))
        from_batch = training and self.batch_norm_statistics == "batch"
        h = keras.activations.silu(self.norm(h, training=from_batch))
        return self.pointwise_out(h)

    def get_config(self):
        return {**super().get_config(), "d_model": self.d_model, "kernel_size": self.kernel_size,
                "batch_norm_statistics": self.batch_norm_statistics,
                "use_bias": self.use_bias}  # fmt: skip


def _layer_norm():
    return keras.layers.LayerNormalization(epsilon=_EPSILON)


@keras.saving.register_keras_serializable(package="asrkit")
class NemoConformerLayer(CompositeLayer):
    def __init__(
        self, *, d_model: int, num_heads: int, expansion: int, kernel_size: int,
        batch_norm_statistics: str, dropout: float = 0.0, use_bias: bool = True, **kwargs,
    ):  # fmt: skip
        super().__init__(**kwargs)
        self.d_model, self.num_heads, self.expansion = d_model, num_heads, expansion
        self.kernel_size, self.batch_norm_statistics = kernel_size, batch_norm_statistics
        self.dropout, self.use_bias = dropout, use_bias
        self.norm_ff1, self.ff1 = (
            _layer_norm(),
            NemoFeedForward(d_model=d_model, expansion=expansion, use_bias=use_bias),
        )
        self.norm_attention = _layer_norm()
        self.attention = RelPositionSelfAttention(
            d_model=d_model, num_heads=num_heads, use_bias=use_bias
        )
        self.norm_conv = _layer_norm()
        self.conv = NemoConvolution(d_model=d_model, kernel_size=kernel_size,
                                    batch_norm_statistics=batch_norm_statistics,
                                    use_bias=use_bias)  # fmt: skip
        self.norm_ff2, self.ff2 = (
            _layer_norm(),
            NemoFeedForward(d_model=d_model, expansion=expansion, use_bias=use_bias),
        )
        self.norm_out = _layer_norm()

    def call(self, x, lengths, training=False, seed=None):
        """`seed` [2]: the residual dropout masks (NeMo's `dropout`) are drawn from it, so a
        recomputed block replays them."""
        valid = tf.sequence_mask(lengths, tf.shape(x)[1])

        def drop(h, salt):
            return seeded_dropout(h, self.dropout, seed, salt, training and seed is not None)

        x = x + 0.5 * drop(self.ff1(self.norm_ff1(x)), 0)
        x = x + drop(self.attention(self.norm_attention(x), valid), 1)
        x = x + drop(self.conv(self.norm_conv(x), lengths, training=training), 2)
        x = x + 0.5 * drop(self.ff2(self.norm_ff2(x)), 3)
        return self.norm_out(x)

    def get_config(self):
        return {**super().get_config(), "d_model": self.d_model, "num_heads": self.num_heads,
                "expansion": self.expansion, "kernel_size": self.kernel_size,
                "batch_norm_statistics": self.batch_norm_statistics,
                "dropout": self.dropout, "use_bias": self.use_bias}  # fmt: skip


@keras.saving.register_keras_serializable(package="asrkit")
class NemoConformerEncoder(CompositeLayer):
    """features [B, T, F], feature_lengths [B] -> encoder frames [B, T', D], lengths
    (frames past a length are not zeroed, as in NeMo: callers use the lengths)."""

    def __init__(
        self, *, d_model: int, num_layers: int, num_heads: int, expansion: int,
        kernel_size: int, subsampling: str, subsampling_factor: int, subsampling_channels: int,
        xscaling: bool, batch_norm_statistics: str = "running", dropout: float = 0.0,
        use_bias: bool = True, recompute: bool = False, **kwargs,
    ):  # fmt: skip
        super().__init__(**kwargs)
        self.settings = dict(
            d_model=d_model, num_layers=num_layers, num_heads=num_heads, expansion=expansion,
            kernel_size=kernel_size, subsampling=subsampling,
            subsampling_factor=subsampling_factor, subsampling_channels=subsampling_channels,
            xscaling=xscaling, batch_norm_statistics=batch_norm_statistics, dropout=dropout,
            use_bias=use_bias, recompute=recompute,
        )  # fmt: skip
        self.d_model, self.xscaling, self.dropout = d_model, xscaling, dropout
        self.recompute = recompute
        self.seeds = keras.random.SeedGenerator()
        self.subsampling = NemoSubsampling(
            kind=subsampling, factor=subsampling_factor, channels=subsampling_channels,
            d_model=d_model,
        )  # fmt: skip
        self.blocks = [
            NemoConformerLayer(
                d_model=d_model,
                num_heads=num_heads,
                expansion=expansion,
                kernel_size=kernel_size,
                batch_norm_statistics=batch_norm_statistics,
                dropout=dropout,
                use_bias=use_bias,
            )
            for _ in range(num_layers)
        ]

    @property
    def output_dim(self) -> int:
        return self.d_model

    def call(self, features, feature_lengths, training=False):
        x, lengths = self.subsampling(features, feature_lengths)
        if self.xscaling:
            x = x * math.sqrt(self.d_model)
        # Drawn here, outside any recomputed block, so a recomputation replays the masks.
        seed = block_seeds(self.seeds, training and self.dropout > 0)
        for index, block in enumerate(self.blocks):
            block_seed = tf.random.experimental.stateless_fold_in(seed, index)

            def run(x, block=block, block_seed=block_seed):
                return block(x, lengths, training=training, seed=block_seed)

            x = maybe_recomputed(run, self.recompute and training)(x)
        return x, lengths

    def get_config(self):
        return {**super().get_config(), **self.settings}
