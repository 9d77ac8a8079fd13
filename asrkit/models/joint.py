"""The joint network: one encoder frame and one predictor state -> logits over V."""

from __future__ import annotations

import keras
import tensorflow as tf

from asrkit.models.layers import CompositeLayer


@keras.saving.register_keras_serializable(package="asrkit")
class Joint(CompositeLayer):
    def __init__(self, *, vocab_size: int, dim: int, **kwargs):
        super().__init__(**kwargs)
        self.vocab_size, self.dim = vocab_size, dim
        self.encoder_proj = keras.layers.Dense(dim, name="encoder_proj")
        self.predictor_proj = keras.layers.Dense(dim, use_bias=False, name="predictor_proj")
        self.output_layer = keras.layers.Dense(vocab_size, name="output")

    def project(self, encoded, predicted):
        """The two projections before the joint's widest tensor: encoded [B, T, De] ->
        [B, T, D], predicted [B, U+1, Dp] -> [B, U+1, D] (what a fused loss takes)."""
        return self.encoder_proj(encoded), self.predictor_proj(predicted)

    def call(self, encoded, predicted):
        """encoded [B, T, De], predicted [B, U+1, Dp] -> logits [B, T, U+1, V].

        Also takes [B, De] and [B, Dp] (one frame, one state: decoding) -> [B, V]."""
        if encoded.shape.rank == 2:
            hidden = self.encoder_proj(encoded) + self.predictor_proj(predicted)
        else:
            enc = self.encoder_proj(encoded)[:, :, None, :]
            hidden = enc + self.predictor_proj(predicted)[:, None, :, :]
        return self.output_layer(tf.tanh(hidden))

    def get_config(self):
        return {**super().get_config(), "vocab_size": self.vocab_size, "dim": self.dim}


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
