"""The predictor (label network): previous labels -> [B, U+1, D].

`call(labels)` is for training (the blank id doubles as the start symbol, so position 0
sees only it); `step(tokens, state)` advances one label at a time for decoding.
"""

from __future__ import annotations

import keras
import tensorflow as tf

from asrkit.models.layers import CompositeLayer
from asrkit.tokenizer import BLANK_ID


@keras.saving.register_keras_serializable(package="asrkit")
class LSTMPredictor(CompositeLayer):
    def __init__(
        self,
        vocab_size: int,
        embed_dim: int = 128,
        units: int = 320,
        num_layers: int = 1,
        dropout: float = 0.1,
        **kwargs,
    ):
        super().__init__(**kwargs)
        self.vocab_size, self.embed_dim, self.units = vocab_size, embed_dim, units
        self.num_layers, self.dropout = num_layers, dropout
        self.embedding = keras.layers.Embedding(vocab_size, embed_dim, name="embedding")
        self.lstms = [
            keras.layers.LSTM(units, return_sequences=True, return_state=True)
            for _ in range(num_layers)
        ]
        self.drop = keras.layers.Dropout(dropout)

    @property
    def output_dim(self) -> int:
        return self.units

    def call(self, labels, training=False):
        """labels [B, U] -> [B, U+1, units]."""
        start = tf.fill([tf.shape(labels)[0], 1], tf.constant(BLANK_ID, labels.dtype))
        x = self.embedding(tf.concat([start, labels], axis=1))
        for lstm in self.lstms:
            x, _, _ = lstm(x, training=training)
            x = self.drop(x, training=training)
        return x

    def initial_state(self, batch_size) -> list[tuple[tf.Tensor, tf.Tensor]]:
        zeros = tf.zeros([batch_size, self.units], self.compute_dtype)
        return [(zeros, zeros) for _ in range(self.num_layers)]

    def step(self, tokens, state):
        """tokens [B] (the last emitted label, blank at the start) -> ([B, units], new state)."""
        x = self.embedding(tokens)[:, None, :]
        new_state = []
        for lstm, (h, c) in zip(self.lstms, state, strict=True):
            x, h, c = lstm(x, initial_state=[h, c])
            new_state.append((h, c))
        return x[:, 0, :], new_state

    def get_config(self):
        return {
            **super().get_config(),
            "vocab_size": self.vocab_size,
            "embed_dim": self.embed_dim,
            "units": self.units,
            "num_layers": self.num_layers,
            "dropout": self.dropout,
        }
