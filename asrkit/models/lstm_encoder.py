"""A small LSTM encoder for CPUs: ×4 conv subsampling, then unidirectional LSTM layers.

Unidirectional on purpose: a frame's output never depends on later (possibly padded)
frames, so batching cannot change an utterance's encoding.
"""

from __future__ import annotations

import keras
import tensorflow as tf

from asrkit.config import EncoderConfig
from asrkit.models.encoder import Encoder
from asrkit.models.layers import (
    block_seeds,
    maybe_recomputed,
    seeded_dropout,
    zero_padding,
)
from asrkit.models.subsampling import ConvSubsampling, subsample_piece


@keras.saving.register_keras_serializable(package="asrkit")
class LSTMEncoder(Encoder):
    """features [B, T, F], feature_lengths [B] -> encoder frames [B, T', units], lengths."""

    def __init__(
        self,
        *,
        units: int,
        num_layers: int,
        dropout: float,
        subsampling_filters: int,
        recompute: bool = EncoderConfig.recompute,
        **kwargs,
    ):
        super().__init__(**kwargs)
        self.units, self.num_layers, self.dropout = units, num_layers, dropout
        self.subsampling_filters, self.recompute = subsampling_filters, recompute
        self.subsampling = ConvSubsampling(filters=subsampling_filters, output_dim=units)
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

    @property
    def blocks(self) -> list:
        return self.lstms

    @property
    def streams(self) -> bool:
        return True  # causal: streams without chunks

    def finish_stream(self, state):
        """The end of the streams: nothing waits (every frame left when it was made)."""
        return tf.zeros([tf.shape(state[0][0])[0], 0, self.units], self.compute_dtype), state

    def initial_stream_state(self, batch_size) -> list[tuple[tf.Tensor, tf.Tensor]]:
        """Each LSTM layer's (h, c) before a stream's first frame."""
        zeros = tf.zeros([batch_size, self.units], self.compute_dtype)
        return [(zeros, zeros) for _ in self.lstms]

    def stream(self, features, state):
        """The next piece of streams already encoded up to here: features [B, F, mel] (all
        real frames, starting at 4 × the encoder frames made so far; F may be < 7) ->
        (encoder frames [B, encoder_frames(F), units], the state after them). Encoder frame t
        sees feature frames [4t, 4t + 6] and the LSTMs are causal, so encoding a stream in
        pieces makes the frames of one call on the whole (inference only: no dropout). The
        caller keeps the features from 4 × (frames returned) on for the next piece."""
        x = subsample_piece(self.subsampling, features)
        new_state = []
        for lstm, norm, (h, c) in zip(self.lstms, self.norms, state, strict=True):
            out, h, c = _run_cell(lstm.cell, x, h, c)
            x = norm(x + out)
            new_state.append((h, c))
        return x, new_state

    def get_config(self):
        return {
            **super().get_config(),
            "units": self.units,
            "num_layers": self.num_layers,
            "dropout": self.dropout,
            "subsampling_filters": self.subsampling_filters,
            "recompute": self.recompute,
        }


def _run_cell(cell, x, h, c):
    """An LSTM cell over x [B, T, D] from (h, c) -> (outputs [B, T, units], h, c)."""
    steps = tf.shape(x)[1]
    outputs = tf.zeros([tf.shape(x)[0], 0, cell.units], x.dtype)

    def body(t, h, c, outputs):
        out, (h, c) = cell(x[:, t], [h, c])
        return t + 1, h, c, tf.concat([outputs, out[:, None]], axis=1)

    state = tf.TensorShape([None, cell.units])
    invariants = [tf.TensorShape([]), state, state, tf.TensorShape([None, None, cell.units])]
    _, h, c, outputs = tf.while_loop(
        lambda t, *_: t < steps, body, [0, h, c, outputs], shape_invariants=invariants
    )
    return outputs, h, c
