"""The tf.data input pipeline: TFRecord shards -> bucketed, padded, typed micro-batches.

Batching is by duration: bucket boundaries are quantiles of the utterance lengths, each
bucket's batch size is the audio budget divided by its boundary, and every batch is
padded to its bucket boundary, so there are few distinct shapes and little padding.
Order is a pure function of (seed, epoch): a resumed run rebuilds the same epoch and
skips the micro-batches it already consumed. Augmentation runs per utterance, before
padding, with stateless randomness keyed by (seed, epoch, position): an optional
frequency warp of the log-mel bins (a new vocal tract length per utterance, on the
features before normalisation), then SpecAugment's masks.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np
import tensorflow as tf

from asrkit.config import ExperimentConfig
from asrkit.data.records import parse_example
from asrkit.features import encoder_frames


class Batch(NamedTuple):
    """One micro-batch. Masks derive from the lengths; padding is 0 (labels: blank)."""

    features: tf.Tensor  # [B, T, F] float32
    feature_lengths: tf.Tensor  # [B] int32
    labels: tf.Tensor  # [B, U] int32
    label_lengths: tf.Tensor  # [B] int32


@dataclass(frozen=True)
class SpecAugmentConfig:
    freq_masks: int = 2
    freq_width: int = 27  # bins, at most
    time_masks: int = 2
    time_width_ratio: float = 0.05  # at most this fraction of the utterance, per mask


@dataclass(frozen=True)
class PipelineConfig:
    batch_seconds: float = 60.0  # audio per micro-batch, padding included
    num_buckets: int = 8
    shuffle_buffer: int = 2048
    frame_step_seconds: float = 0.01
    spec_augment: SpecAugmentConfig | None = field(default_factory=SpecAugmentConfig)
    # Labels are padded to a multiple of this (with blank, beyond label_lengths): a new
    # longest transcript then rarely means a new shape, so compiled steps are reused.
    label_pad_multiple: int = 8
    # Warp the mel axis by a factor drawn per utterance from [1 - w, 1 + w] (0: off).
    freq_warp: float = 0.0


def pipeline_config(config: ExperimentConfig, replicas: int = 1) -> PipelineConfig:
    """The input pipeline a config describes; a global micro-batch holds
    `data.batch_seconds` per replica."""
    d = config.data
    return PipelineConfig(
        batch_seconds=d.batch_seconds * replicas,
        num_buckets=d.num_buckets,
        shuffle_buffer=d.shuffle_buffer,
        label_pad_multiple=d.label_pad_multiple,
        freq_warp=d.freq_warp,
        frame_step_seconds=config.features.frame_step / config.features.sample_rate,
        **({} if d.spec_augment else {"spec_augment": None}),
    )


def bucket_plan(frame_lengths, config: PipelineConfig) -> tuple[list[int], list[int]]:
    """Boundaries (exclusive upper frame counts) and a batch size per bucket.

    Bucket i holds lengths in [boundaries[i-1], boundaries[i]) and is padded to
    boundaries[i] - 1 frames; its batch size keeps batch × padded length within budget.
    """
    lengths = np.asarray(frame_lengths)
    if lengths.size == 0:
        raise ValueError("bucket_plan: no utterances")
    quantiles = np.quantile(lengths, np.linspace(0, 1, config.num_buckets + 1)[1:])
    boundaries = sorted({int(q) + 1 for q in quantiles})
    budget = config.batch_seconds / config.frame_step_seconds
    sizes = [max(1, math.floor(budget / (b - 1))) if b > 1 else 1 for b in boundaries]
    return boundaries, sizes


def bucket_index(frame_lengths, boundaries: list[int]) -> np.ndarray:
    """The bucket of each length under `bucket_plan`'s boundaries (as tf.data buckets them:
    bucket i holds [boundaries[i-1], boundaries[i]); len(boundaries) is the overflow)."""
    return np.searchsorted(np.asarray(boundaries), np.asarray(frame_lengths), side="right")


def enough_frames(frames, tokens):
    """At least as many encoder frames as tokens, and at least one; NumPy or TF."""
    encoded = encoder_frames(frames)
    return (encoded >= tokens) & (encoded >= 1)


def keep_example(example: dict) -> tf.Tensor:
    return enough_frames(example["feature_lengths"], example["label_lengths"])


def count_filtered(files: list[str], config: PipelineConfig, num_mel_bins: int = 80) -> int:
    """How many utterances `make_dataset` drops for having too few frames for their tokens."""
    dataset = tf.data.TFRecordDataset(sorted(files)).map(lambda r: parse_example(r, num_mel_bins))
    dropped = dataset.filter(lambda e: tf.logical_not(keep_example(e)))
    return int(dropped.reduce(0, lambda n, _: n + 1))


def spec_augment(
    features: tf.Tensor, length: tf.Tensor, config: SpecAugmentConfig, seed: tf.Tensor
) -> tf.Tensor:
    """Frequency and time masks on one [T, F] utterance; time masks stay inside `length`."""
    frames, bins = tf.shape(features)[0], tf.shape(features)[1]
    seeds = tf.random.experimental.stateless_split(seed, config.freq_masks + config.time_masks)
    keep = tf.ones_like(features, dtype=tf.bool)
    for i in range(config.freq_masks):
        width = _uniform_int(seeds[i], 0, config.freq_width + 1, salt=0)
        start = _uniform_int(seeds[i], 0, tf.maximum(bins - width, 0) + 1, salt=1)
        band = (tf.range(bins) >= start) & (tf.range(bins) < start + width)
        keep &= ~band[None, :]
    max_width = tf.cast(config.time_width_ratio * tf.cast(length, tf.float32), tf.int32)
    for j in range(config.time_masks):
        s = seeds[config.freq_masks + j]
        width = _uniform_int(s, 0, max_width + 1, salt=0)
        start = _uniform_int(s, 0, tf.maximum(length - width, 0) + 1, salt=1)
        span = (tf.range(frames) >= start) & (tf.range(frames) < start + width)
        keep &= ~span[:, None]
    return tf.where(keep, features, tf.zeros_like(features))


def frequency_warp(features: tf.Tensor, factor: tf.Tensor) -> tf.Tensor:
    """[T, F] log-mel -> the same utterance as if spoken with formants `factor` times higher.

    Output bin i takes the (linearly interpolated) input at bin i / factor, clamped to the
    edges: a vocal-tract-length change on the mel scale, as VTLP does it (Jaitly & Hinton,
    2013) but on the features, so it costs one gather per utterance. factor 1 is identity.
    """
    bins = tf.shape(features)[1]
    top = tf.cast(bins - 1, tf.float32)
    factor = tf.cast(factor, tf.float32)
    source = tf.clip_by_value(tf.range(bins, dtype=tf.float32) / factor, 0.0, top)
    low = tf.cast(tf.floor(source), tf.int32)
    high = tf.minimum(low + 1, bins - 1)
    weight = source - tf.cast(low, tf.float32)
    below, above = tf.gather(features, low, axis=1), tf.gather(features, high, axis=1)
    return below + (above - below) * weight[None, :]


def _uniform_int(seed, low, high, salt: int) -> tf.Tensor:
    seed = tf.random.experimental.stateless_fold_in(seed, salt)
    return tf.random.stateless_uniform([], seed, minval=low, maxval=high, dtype=tf.int32)


def make_dataset(
    files: list[str],
    config: PipelineConfig,
    boundaries: list[int],
    batch_sizes: list[int],
    *,
    training: bool,
    seed: int = 0,
    epoch: int = 0,
    skip_batches: int = 0,
    num_mel_bins: int = 80,
    normalize=None,
) -> tf.data.Dataset:
    """Micro-batches of `Batch`; training shuffles and augments as a function of (seed, epoch)."""
    files = sorted(str(f) for f in files)
    order_seed = seed * 100_003 + epoch
    dataset = tf.data.Dataset.from_tensor_slices(files)
    if training:
        dataset = dataset.shuffle(len(files), seed=order_seed, reshuffle_each_iteration=False)
    dataset = dataset.interleave(
        tf.data.TFRecordDataset, cycle_length=4, num_parallel_calls=1, deterministic=True
    )
    # The transcript is for scoring (decoding), not training: dropped before shuffling.
    dataset = dataset.map(lambda r: _without_text(parse_example(r, num_mel_bins)))
    dataset = dataset.filter(lambda e: keep_example(e))
    if training:
        dataset = dataset.shuffle(
            config.shuffle_buffer, seed=order_seed, reshuffle_each_iteration=False
        )
    augment = config.spec_augment if training else None
    warp = config.freq_warp if training else 0.0
    if augment is not None or warp > 0:

        def apply(index, e):
            key = tf.stack([tf.constant(order_seed, tf.int64), index])
            features = e["features"]
            if warp > 0:
                draw = tf.random.experimental.stateless_fold_in(key, 7)
                factor = tf.random.stateless_uniform([], draw, 1.0 - warp, 1.0 + warp)
                features = frequency_warp(features, factor)
            if normalize is not None:
                features = normalize(features)
            if augment is not None:
                features = spec_augment(features, e["feature_lengths"], augment, key)
            return {**e, "features": features}

        dataset = dataset.enumerate().map(apply, num_parallel_calls=tf.data.AUTOTUNE)
    elif normalize is not None:
        dataset = dataset.map(lambda e: {**e, "features": normalize(e["features"])})
    dataset = dataset.bucket_by_sequence_length(
        element_length_func=lambda e: e["feature_lengths"],
        bucket_boundaries=boundaries,
        bucket_batch_sizes=[*batch_sizes, 1],
        padded_shapes={
            "id": [],
            "features": [None, num_mel_bins],
            "feature_lengths": [],
            "labels": [None],
            "label_lengths": [],
            "duration": [],
        },
        pad_to_bucket_boundary=False,
    )
    dataset = dataset.map(lambda b: _pad_to_bucket(b, boundaries, config.label_pad_multiple))
    if skip_batches:
        dataset = dataset.skip(skip_batches)
    return dataset.prefetch(tf.data.AUTOTUNE)


def _without_text(example: dict) -> dict:
    return {key: value for key, value in example.items() if key != "text"}


def _pad_to_bucket(batch: dict, boundaries: list[int], label_multiple: int = 1) -> Batch:
    """Pads the time axis to the batch's bucket boundary - 1 and the label axis to a
    multiple of `label_multiple` (few distinct shapes)."""
    longest = tf.reduce_max(batch["feature_lengths"])
    bounds = tf.constant(boundaries, tf.int32)
    index = tf.searchsorted(bounds, [longest], side="right")[0]
    target = tf.where(
        index < len(boundaries), bounds[tf.minimum(index, len(boundaries) - 1)] - 1, longest
    )
    target = tf.maximum(target, longest)
    pad = target - tf.shape(batch["features"])[1]
    features = tf.pad(batch["features"], [[0, 0], [0, pad], [0, 0]])
    labels = batch["labels"]
    label_pad = -tf.shape(labels)[1] % label_multiple
    labels = tf.pad(labels, [[0, 0], [0, label_pad]])
    return Batch(features, batch["feature_lengths"], labels, batch["label_lengths"])
