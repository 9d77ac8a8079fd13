"""Convolutional ×4 time subsampling (its frame arithmetic: `asrkit.features.encoder_frames`).

Two 3×3 convolutions with stride 2 and *valid* padding: output frame t always sees input
frames [4t, 4t+6], whatever the padded length, so padding never shifts or leaks into an
utterance's frames (TF's "same" padding would, depending on the padded length's parity).
"""

from __future__ import annotations

import keras
import tensorflow as tf

from asrkit.features import MIN_FEATURE_FRAMES, conv_frames, encoder_frames
from asrkit.models.layers import CompositeLayer, zero_padding


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

    def call(self, features, lengths):
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
