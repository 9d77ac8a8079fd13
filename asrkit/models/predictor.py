"""The predictor (label network): previous labels -> [B, U+1, D].

`call(labels)` is for training (the blank id doubles as the start symbol, so position 0
sees only it); `step(tokens, state)` advances one label at a time for decoding. The state
is a nested structure of [B, ...] tensors that decoders carry without looking inside.

Two kinds (`model.predictor.kind`):
* `lstm`: embedding -> LSTM layers; the state is each layer's (h, c). With `input_bias`
  each layer has torch's second bias, on its input (`TorchLSTMCell`).
* `stateless`: the last `context_size` labels only (Ghodsi et al. 2020, "Rnn-transducer
  with stateless prediction network"; icefall's default): their embeddings, concatenated,
  through one dense layer. No recurrence, so no sequential loop over labels in training;
  the state is the previous `context_size - 1` labels.
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
        *,
        vocab_size: int,
        embed_dim: int,
        units: int,
        num_layers: int,
        dropout: float,
        blank_as_pad: bool = False,
        input_bias: bool = False,
        **kwargs,
    ):
        super().__init__(**kwargs)
        self.vocab_size, self.embed_dim, self.units = vocab_size, embed_dim, units
        self.num_layers, self.dropout, self.blank_as_pad = num_layers, dropout, blank_as_pad
        self.input_bias = input_bias
        self.embedding = keras.layers.Embedding(vocab_size, embed_dim, name="embedding")
        self.lstms = [
            keras.layers.RNN(TorchLSTMCell(units), return_sequences=True, return_state=True)
            if input_bias else keras.layers.LSTM(units, return_sequences=True, return_state=True)
            for _ in range(num_layers)
        ]  # fmt: skip
        self.drop = keras.layers.Dropout(dropout)

    @property
    def output_dim(self) -> int:
        return self.units

    def call(self, labels, training=False):
        """labels [B, U] -> [B, U+1, units]."""
        start = tf.fill([tf.shape(labels)[0], 1], tf.constant(BLANK_ID, labels.dtype))
        x = self._embed(tf.concat([start, labels], axis=1))
        for lstm in self.lstms:
            x = _sequence(lstm, x)
            x = self.drop(x, training=training)
        return x

    def _embed(self, tokens):
        x = self.embedding(tokens)
        if self.blank_as_pad:  # the blank's row is a zero vector (and learns nothing)
            x = x * tf.cast(tokens != BLANK_ID, x.dtype)[..., None]
        return x

    def initial_state(self, batch_size) -> list[tuple[tf.Tensor, tf.Tensor]]:
        zeros = tf.zeros([batch_size, self.units], self.compute_dtype)
        return [(zeros, zeros) for _ in range(self.num_layers)]

    def step(self, tokens, state):
        """tokens [B] (the last emitted label, blank at the start) -> ([B, units], new state)."""
        x = self._embed(tokens)
        new_state = []
        for lstm, (h, c) in zip(self.lstms, state, strict=True):
            # the cell itself: one step needs no time loop, and a loop's tensor lists inside
            # the search's conditional branch are what LiteRT cannot lower
            x, (h, c) = lstm.cell(x, [h, c])
            new_state.append((h, c))
        return x, new_state

    def get_config(self):
        return {
            **super().get_config(),
            "vocab_size": self.vocab_size,
            "embed_dim": self.embed_dim,
            "units": self.units,
            "num_layers": self.num_layers,
            "dropout": self.dropout,
            "blank_as_pad": self.blank_as_pad,
            "input_bias": self.input_bias,
        }


def _sequence(lstm, x):
    """An LSTM layer's outputs for all positions of x [B, T, D] -> [B, T, units]: the input
    projection of every position in one product, then `lstm_recurrence`. The same function
    as calling the layer; its weights are the layer's own."""
    if not lstm.built:
        lstm.build(x.shape)
    cell, dtype = lstm.cell, x.dtype
    projected = tf.einsum("btd,dg->btg", x, tf.cast(cell.kernel, dtype)) + tf.cast(cell.bias, dtype)
    if isinstance(cell, TorchLSTMCell):
        projected += tf.cast(cell.input_bias, dtype)
    return lstm_recurrence(projected, tf.cast(cell.recurrent_kernel, dtype))


def _lstm_step(z, c):
    """One LSTM step from the gates' pre-activations z [B, 4u] (i, f, c, o) and the cell
    c -> (h, the new cell, the activated gates (i, f, g, o), each [B, u])."""
    i, f, g, o = tf.split(z, 4, axis=-1)
    i, f, g, o = tf.sigmoid(i), tf.sigmoid(f), tf.tanh(g), tf.sigmoid(o)
    c = f * c + i * g
    return o * tf.tanh(c), c, (i, f, g, o)


@tf.custom_gradient
def lstm_recurrence(projected, recurrent_kernel):
    """h [B, T, u] of an LSTM from zero state, given each position's projected input
    `projected` [B, T, 4u] (x·W + biases, Keras' gate order i, f, c, o) and the recurrent
    kernel [u, 4u].

    Its gradient is written out (backpropagation through time): the loop only carries the
    gates' gradients back, and the recurrent kernel's gradient is one product over all
    positions afterwards. Differentiating the loop instead computes a [u, 4u] outer
    product at every position and sums them one by one, most of a 640-unit predictor's
    backward time."""
    inputs = tf.transpose(projected, [1, 0, 2])  # time-major [T, B, 4u]
    zeros = tf.zeros([tf.shape(inputs)[1], recurrent_kernel.shape[0]], inputs.dtype)

    def forward(carry, z):
        h, c, _ = carry
        h, c, gates = _lstm_step(z + tf.matmul(h, recurrent_kernel), c)
        return h, c, tf.concat(gates, axis=-1)  # kept for the backward pass

    h, c, gates = tf.scan(forward, inputs, initializer=(zeros, zeros, tf.zeros_like(inputs[0])))

    def gradient(d_h):
        c_before = tf.concat([zeros[None], c[:-1]], axis=0)

        def backward(carry, position):
            d_h_later, d_c_later, _ = carry
            d_h_here, c_here, c_prev, gates_here = position
            i, f, g, o = tf.split(gates_here, 4, axis=-1)
            d_out = d_h_here + d_h_later
            squashed = tf.tanh(c_here)
            d_c = d_c_later + d_out * o * (1 - squashed * squashed)
            d_z = tf.concat([
                d_c * g * i * (1 - i), d_c * c_prev * f * (1 - f), d_c * i * (1 - g * g),
                d_out * squashed * o * (1 - o),
            ], axis=-1)  # fmt: skip
            return tf.matmul(d_z, recurrent_kernel, transpose_b=True), d_c * f, d_z

        _, _, d_z = tf.scan(
            backward, (tf.transpose(d_h, [1, 0, 2]), c, c_before, gates),
            initializer=(zeros, zeros, tf.zeros_like(inputs[0])), reverse=True,
        )  # fmt: skip
        h_before = tf.concat([zeros[None], h[:-1]], axis=0)
        d_kernel = tf.einsum("tbu,tbg->ug", h_before, d_z)
        return tf.transpose(d_z, [1, 0, 2]), d_kernel

    return tf.transpose(h, [1, 0, 2]), gradient


@keras.saving.register_keras_serializable(package="asrkit")
class TorchLSTMCell(keras.layers.LSTMCell):
    """An LSTM cell with torch's two biases: gates = x·W + b_input + h·U + b (Keras' gate
    order i, f, c, o; sigmoid and tanh). The same function as one bias of their sum, but
    each is its own variable, so an optimizer moves them as torch's does."""

    def build(self, input_shape):
        super().build(input_shape)
        self.input_bias = self.add_weight(
            shape=(4 * self.units,), initializer="zeros", name="input_bias"
        )

    def call(self, inputs, states, training=False):
        h, c = states
        z = inputs @ self.kernel + self.input_bias + h @ self.recurrent_kernel + self.bias
        h, c, _ = _lstm_step(z, c)
        return h, [h, c]


@keras.saving.register_keras_serializable(package="asrkit")
class StatelessPredictor(CompositeLayer):
    """Output at position u depends on labels u-context+1 .. u (blank before the start)."""

    def __init__(
        self,
        *,
        vocab_size: int,
        embed_dim: int,
        units: int,
        context_size: int,
        dropout: float,
        **kwargs,
    ):
        super().__init__(**kwargs)
        self.vocab_size, self.embed_dim, self.units = vocab_size, embed_dim, units
        self.context_size, self.dropout = context_size, dropout
        self.embedding = keras.layers.Embedding(vocab_size, embed_dim, name="embedding")
        self.context = keras.layers.Dense(units, activation="relu", name="context")
        self.drop = keras.layers.Dropout(dropout)

    @property
    def output_dim(self) -> int:
        return self.units

    def _window(self, history, training=False):
        """history [B, L + context - 1] -> [B, L, units], one window per output."""
        x = self.embedding(history)  # [B, L + C - 1, E]
        length = tf.shape(history)[1] - self.context_size + 1
        windows = [x[:, i : i + length, :] for i in range(self.context_size)]
        x = self.context(tf.concat(windows, axis=-1))
        return self.drop(x, training=training)

    def call(self, labels, training=False):
        """labels [B, U] -> [B, U+1, units]."""
        blank = tf.constant(BLANK_ID, labels.dtype)
        start = tf.fill([tf.shape(labels)[0], self.context_size], blank)
        return self._window(tf.concat([start, labels], axis=1), training)

    def initial_state(self, batch_size) -> tf.Tensor:
        return tf.fill([batch_size, self.context_size - 1], BLANK_ID)

    def step(self, tokens, state):
        """tokens [B] -> ([B, units], the last context - 1 labels)."""
        history = tf.concat([state, tf.cast(tokens, state.dtype)[:, None]], axis=1)
        return self._window(history)[:, 0, :], history[:, 1:]

    def get_config(self):
        return {
            **super().get_config(),
            "vocab_size": self.vocab_size,
            "embed_dim": self.embed_dim,
            "units": self.units,
            "context_size": self.context_size,
            "dropout": self.dropout,
        }


def build_predictor(vocab_size: int, config, torch_biases: bool = False) -> keras.layers.Layer:
    """The predictor a `PredictorConfig` describes (`torch_biases`: LSTM layers with
    torch's second bias)."""
    if config.kind == "stateless":
        return StatelessPredictor(
            vocab_size=vocab_size, embed_dim=config.embed_dim, units=config.units,
            context_size=config.context_size, dropout=config.dropout, name="predictor",
        )  # fmt: skip
    return LSTMPredictor(
        vocab_size=vocab_size, embed_dim=config.embed_dim, units=config.units,
        num_layers=config.num_layers, dropout=config.dropout,
        blank_as_pad=config.blank_as_pad, input_bias=torch_biases, name="predictor",
    )  # fmt: skip
