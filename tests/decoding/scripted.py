"""A transducer whose decisions are tables, for testing searches against a plain loop:
with n symbols emitted so far, the joint reads column n of the encoder frame."""

import tensorflow as tf


class ScriptedTransducer:
    """Encoder frames are tables [T, slots]: with n symbols emitted so far, at frame t the
    best symbol is 1 where table[t, n] > 0, else blank. The predictor's output is the
    one-hot of n (others -100); the joint picks table[t, n] as symbol 1's logit (blank's
    is 0)."""

    def __init__(self, slots):
        self.slots = slots
        self.predictor = self
        self.joint = self

    def encoder_proj(self, encoded):
        return encoded

    def predictor_proj(self, predicted):
        return predicted

    def initial_state(self, batch):
        return tf.fill([batch, 1], -1)  # [B, 1]: n - 1

    def step(self, tokens, state):
        count = state + 1
        return tf.one_hot(count[:, 0], self.slots) * 100.0 - 100.0, count

    def activate(self, hidden):
        return hidden

    def output_layer(self, hidden):
        picked = tf.reduce_max(hidden[..., : self.slots], -1)
        return tf.stack([tf.zeros_like(picked), picked], -1)
