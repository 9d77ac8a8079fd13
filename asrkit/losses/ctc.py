"""The CTC loss of a hybrid network's CTC head on the encoder frames.

The head (`model.ctc_head`) maps each encoder frame to the vocabulary (the transducer's
blank is CTC's blank); its CTC loss, weighted by `loss.ctc_weight`, is added to each
utterance's transducer loss (or interpolated with it, as NeMo's hybrids do). The encoder
then gets a direct, frame-level training signal from the first update, as in hybrid
CTC/transducer training (icefall, ESPnet, NeMo), instead of one that must pass through a
joint and a predictor that are still learning.

An utterance CTC cannot align — fewer frames than its labels plus the repeats that need a
blank between them — adds 0 (and no gradient) rather than infinity, so it cannot make the
accumulation window non-finite and skip it.
"""

from __future__ import annotations

import tensorflow as tf


def ctc_frames_needed(labels, label_lengths):
    """The fewest frames a CTC path for each utterance needs: its labels plus one blank
    between each pair of equal neighbours. labels [B, U] (padding past label_lengths)."""
    labels = tf.convert_to_tensor(labels)
    positions = tf.range(tf.shape(labels)[1])
    real = positions[None, :] < label_lengths[:, None]
    repeats = tf.logical_and(
        tf.equal(labels[:, 1:], labels[:, :-1]), tf.logical_and(real[:, 1:], real[:, :-1])
    )
    return label_lengths + tf.reduce_sum(tf.cast(repeats, label_lengths.dtype), axis=1)


def ctc_losses(logits, labels, logit_lengths, label_lengths, *, blank: int = 0):
    """Per-utterance CTC negative log-likelihoods [B] of `logits` [B, T, V] (unnormalised,
    any float dtype; computed in float32); 0 where the utterance cannot be aligned."""
    labels = tf.cast(labels, tf.int32)
    logit_lengths = tf.cast(logit_lengths, tf.int32)
    label_lengths = tf.cast(label_lengths, tf.int32)
    feasible = ctc_frames_needed(labels, label_lengths) <= logit_lengths
    # An infeasible utterance is scored with no labels (always finite), then dropped.
    safe_lengths = tf.where(feasible, label_lengths, tf.zeros_like(label_lengths))
    positions = tf.range(tf.shape(labels)[1])[None, :]
    safe_labels = tf.where(positions < safe_lengths[:, None], labels, tf.zeros_like(labels))

    def score():
        return tf.nn.ctc_loss(
            safe_labels, tf.cast(logits, tf.float32), safe_lengths, logit_lengths,
            logits_time_major=False, blank_index=blank,
        )  # fmt: skip

    # A replica's empty share of a micro-batch: TensorFlow's CTC kernel fails on B = 0.
    losses = tf.cond(tf.shape(logits)[0] > 0, score, lambda: tf.zeros([0], tf.float32))
    return tf.where(feasible, losses, tf.zeros_like(losses))
