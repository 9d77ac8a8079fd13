"""The joint network: one encoder frame and one predictor state -> logits over V.

hidden = activation(encoder_proj(e) + predictor_proj(p)); logits = output(hidden). A TDT
joint also gives `durations` logits from the same hidden vector (`duration_logits`).
`predictor_bias`: the predictor projection has a bias of its own (torch's layout)."""

from __future__ import annotations

import keras
import tensorflow as tf

from asrkit.models.layers import CompositeLayer


@keras.saving.register_keras_serializable(package="asrkit")
class Joint(CompositeLayer):
    def __init__(
        self, *, vocab_size: int, dim: int, activation: str = "tanh", durations: int = 0,
        predictor_bias: bool = False, **kwargs,
    ):  # fmt: skip
        super().__init__(**kwargs)
        self.vocab_size, self.dim = vocab_size, dim
        self.activation, self.durations = activation, durations
        self.predictor_bias = predictor_bias
        self.encoder_proj = keras.layers.Dense(dim, name="encoder_proj")
        self.predictor_proj = keras.layers.Dense(
            dim, use_bias=predictor_bias, name="predictor_proj"
        )
        self.output_layer = keras.layers.Dense(vocab_size, name="output")
        self.duration_layer = keras.layers.Dense(durations, name="durations") if durations else None

    def activate(self, hidden):
        if self.activation == "relu":  # tf.maximum: Grappler mis-fuses a Relu in these loops
            return tf.maximum(hidden, tf.zeros_like(hidden))
        return tf.tanh(hidden)

    def hidden(self, encoded, predicted):
        """The activated hidden vector: [B, De] and [B, Dp] -> [B, D]; [B, T, De] and
        [B, U+1, Dp] -> [B, T, U+1, D]."""
        if encoded.shape.rank == 2:
            return self.activate(self.encoder_proj(encoded) + self.predictor_proj(predicted))
        enc = self.encoder_proj(encoded)[:, :, None, :]
        return self.activate(enc + self.predictor_proj(predicted)[:, None, :, :])

    def tokens_and_durations(self, encoded, predicted):
        """TDT: (token logits, duration logits) from one hidden vector."""
        hidden = self.hidden(encoded, predicted)
        return self.output_layer(hidden), self.duration_layer(hidden)

    def duration_logits(self, encoded, predicted):
        """TDT: logits over the durations, shaped as `call`'s logits with D for V."""
        return self.duration_layer(self.hidden(encoded, predicted))

    def project(self, encoded, predicted):
        """The two projections before the joint's widest tensor: encoded [B, T, De] ->
        [B, T, D], predicted [B, U+1, Dp] -> [B, U+1, D] (what a fused loss takes)."""
        return self.encoder_proj(encoded), self.predictor_proj(predicted)

    def call(self, encoded, predicted):
        """encoded [B, T, De], predicted [B, U+1, Dp] -> logits [B, T, U+1, V].

        Also takes [B, De] and [B, Dp] (one frame, one state: decoding) -> [B, V]."""
        hidden = self.hidden(encoded, predicted)
        if self.duration_layer is not None and not self.duration_layer.built:
            self.duration_layer(hidden)  # built with the rest, so checkpoints hold it
        return self.output_layer(hidden)

    def get_config(self):
        return {**super().get_config(), "vocab_size": self.vocab_size, "dim": self.dim,
                "activation": self.activation, "durations": self.durations,
                "predictor_bias": self.predictor_bias}  # fmt: skip


@keras.saving.register_keras_serializable(package="asrkit")
class SimpleJoiner(CompositeLayer):
    """The pruned RNN-T loss's trivial joiner: encoder and predictor outputs each projected
    straight to V (logits = am[t] + lm[u]); used only by that training loss."""

    def __init__(self, *, vocab_size: int, **kwargs):
        super().__init__(**kwargs)
        self.vocab_size = vocab_size
        self.am_proj = keras.layers.Dense(vocab_size, name="am_proj")
        self.lm_proj = keras.layers.Dense(vocab_size, name="lm_proj")

    def call(self, encoded, predicted):
        """encoded [B, T, De], predicted [B, U+1, Dp] -> am [B, T, V], lm [B, U+1, V]."""
        return self.am_proj(encoded), self.lm_proj(predicted)

    def get_config(self):
        return {**super().get_config(), "vocab_size": self.vocab_size}
