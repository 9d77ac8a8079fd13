"""Find out-of-memory in the first minute, not hours in: before training, run one forward
and backward pass on the most memory-hungry micro-batch the bucket plan can produce.

A transducer's memory is dominated by the joint's [B, T, U+1, V] activations, so the probe
picks the bucket whose (utterances per replica) x (encoder frames) x (tokens + 1) is largest
and fabricates a batch of exactly that shape (memory depends on shapes, not values). Every
model variable is restored afterwards, so the probe changes nothing — not even the dropout
random state.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import tensorflow as tf

from asrkit.data.order import bucket_index
from asrkit.errors import UserError
from asrkit.features import encoder_frames


@dataclass(frozen=True)
class ProbeShape:
    """One replica's share of the largest micro-batch."""

    utterances: int
    frames: int  # feature frames, padded
    tokens: int  # label length, padded

    @property
    def cells(self) -> int:
        """(frame, token) cells of the joint tensor, the quantity memory grows with."""
        return self.utterances * encoder_frames(self.frames) * (self.tokens + 1)


class OutOfMemory(UserError, RuntimeError):
    """The largest micro-batch does not fit; the message says what to change."""


def largest_micro_batch(frames, tokens, plan, replicas: int = 1) -> ProbeShape:
    """The bucket plan's most memory-hungry micro-batch, per replica."""
    frames, tokens = np.asarray(frames), np.asarray(tokens)
    boundaries, sizes = plan
    buckets = bucket_index(frames, boundaries)
    best = None
    for index, (boundary, size) in enumerate(zip(boundaries, sizes, strict=True)):
        members = buckets == index
        if not members.any():
            continue
        utterances = math.ceil(min(size, int(members.sum())) / replicas)
        shape = ProbeShape(utterances, boundary - 1, int(tokens[members].max()))
        if best is None or shape.cells > best.cells:
            best = shape
    if best is None:
        raise ValueError("largest_micro_batch: no utterances")
    return best


def fabricated_batch(utterances: int, frames: int, tokens: int, num_mel_bins: int) -> tuple:
    """A micro-batch of this shape, every utterance full length (memory depends on shapes)."""
    return (
        tf.zeros([utterances, frames, num_mel_bins]),
        tf.fill([utterances], frames),
        tf.ones([utterances, tokens], tf.int32),
        tf.fill([utterances], tokens),
    )


def forward_backward(model, jit_compile: bool = False, num_mel_bins: int | None = None):
    """A compiled forward + backward pass of the training loss (what a micro-step holds).

    Without XLA it is traced once for any batch shape (`num_mel_bins` given), as the
    training step is for its dataset's padded batches, so measuring many shapes costs one
    trace; XLA compiles per shape anyway."""
    signature = None
    if num_mel_bins and not jit_compile:
        signature = [(
            tf.TensorSpec([None, None, num_mel_bins], tf.float32),
            tf.TensorSpec([None], tf.int32),
            tf.TensorSpec([None, None], tf.int32),
            tf.TensorSpec([None], tf.int32),
        )]  # fmt: skip

    @tf.function(jit_compile=jit_compile, input_signature=signature, autograph=False)
    def step(batch):
        with tf.GradientTape() as tape:
            loss_sum, _ = model.compute_loss_terms(batch, training=True)
        grads = tape.gradient(loss_sum, model.trainable_variables)
        return tf.add_n([tf.reduce_sum(tf.cast(g, tf.float32)) for g in grads if g is not None])

    return step


def probe_memory(model, strategy, shape: ProbeShape, num_mel_bins: int) -> None:
    """Forward + backward on `shape` on every replica; raises `OutOfMemory` if it fails."""
    batch = fabricated_batch(shape.utterances, shape.frames, shape.tokens, num_mel_bins)
    saved = [v.numpy() for v in model.variables]
    step = forward_backward(model)
    try:
        strategy.run(step, args=(batch,))
    except tf.errors.ResourceExhaustedError:
        raise OutOfMemory(
            f"the largest micro-batch ({shape.utterances} utterance(s) x {shape.frames} frames "
            f"x {shape.tokens} tokens per replica) does not fit in device memory: lower "
            "data.batch_seconds (the recipes' --micro-batch-seconds); with "
            "train.effective_batch_seconds set, accumulation keeps the update size the same"
        ) from None
    finally:
        for var, value in zip(model.variables, saved, strict=True):
            var.assign(value)
