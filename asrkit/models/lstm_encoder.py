"""A small LSTM encoder for CPUs: ×4 conv subsampling, then unidirectional LSTM layers.

Unidirectional on purpose: a frame's output never depends on later (possibly padded)
frames, so batching cannot change an utterance's encoding.
"""

from __future__ import annotations

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


@keras.saving.register_keras_serializable(package="asrkit")
class LSTMEncoder(CompositeLayer):
    """features [B, T, F], feature_lengths [B] -> encoder frames [B, T', units], lengths."""

    def __init__(
        self,
        units: int = 320,
        num_layers: int = 2,
        dropout: float = 0.1,
        subsampling_filters: int = 64,
        recompute: bool = False,
        **kwargs,
    ):
        super().__init__(**kwargs)
        self.units, self.num_layers, self.dropout = units, num_layers, dropout
        self.subsampling_filters, self.recompute = subsampling_filters, recompute
        self.subsampling = ConvSubsampling(subsampling_filters, units)
        self.lstms = [keras.layers.LSTM(units, return_sequences=True) for _ in range(num_layers)]
        self.norms = [keras.layers.LayerNormalization() for _ in range(num_layers)]
        self.seeds = keras.random.SeedGenerator()

    @property
    def output_dim(self) -> int:
        return self.units

    def call(self, features, feature_lengths, training=False):
        x, lengths = self.subsampling(features, feature_lengths)
        mask = tf.sequence_mask(lengths, tf.shape(x)[1])
        # Drawn here, outside any recomputed layer, so a recomputation replays the masks.
        seed = block_seeds(self.seeds, training and self.dropout > 0)
        for index, (lstm, norm) in enumerate(zip(self.lstms, self.norms, strict=True)):

            def run(x, lstm=lstm, norm=norm, index=index):
                out = lstm(x, mask=mask, training=training)
                return norm(x + seeded_dropout(out, self.dropout, seed, index, training))

            x = maybe_recomputed(run, self.recompute and training)(x)
        return zero_padding(x, lengths), lengths

    def get_config(self):
        return {
            **super().get_config(),
            "units": self.units,
            "num_layers": self.num_layers,
            "dropout": self.dropout,
            "subsampling_filters": self.subsampling_filters,
            "recompute": self.recompute,
        }
