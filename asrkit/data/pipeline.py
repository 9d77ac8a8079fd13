"""The tf.data input pipeline: TFRecord shards -> bucketed, padded, typed micro-batches.

Batching is by duration: bucket boundaries are quantiles of the utterance lengths, each
bucket's batch size is the audio budget divided by its boundary, and every batch is
padded to its bucket boundary, so there are few distinct shapes and little padding.
Which utterances form each micro-batch, in which order, is planned before reading
(`asrkit.data.order`): a pure function of (seed, epoch), so a resumed run reads only the
micro-batches after the ones it consumed, and host memory is a few micro-batches.
Augmentation runs per utterance, before padding, with stateless randomness keyed by
(seed, epoch, utterance): an optional frequency warp of the log-mel bins (a new vocal
tract length per utterance, on the features before normalisation), then SpecAugment.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np
import tensorflow as tf

from asrkit.config import ExperimentConfig
from asrkit.data.audio_shards import (
    OnTheFly,
    epoch_frames,
    epoch_speeds,
    fastest_frames,
    slowest_frames,
)
from asrkit.data.order import RecordIndex, epoch_order, index_records, order_seed
from asrkit.data.records import lengths_index, parse_example
from asrkit.errors import InputError
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
    time_width_frames: int = 0  # > 0: at most this many frames per mask instead


@dataclass(frozen=True)
class PipelineConfig:
    batch_seconds: float = 60.0  # audio per micro-batch, padding included
    num_buckets: int = 8
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
        label_pad_multiple=d.label_pad_multiple,
        freq_warp=d.freq_warp,
        frame_step_seconds=config.features.frame_step / config.features.sample_rate,
        spec_augment=SpecAugmentConfig(
            freq_masks=d.spec_freq_masks, freq_width=d.spec_freq_width,
            time_masks=d.spec_time_masks, time_width_ratio=d.spec_time_width,
            time_width_frames=d.spec_time_frames,
        ) if d.spec_augment else None,
    )  # fmt: skip


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


def enough_frames(frames, tokens, encoder=None):
    """At least as many encoder frames (of `encoder`, an EncoderConfig) as tokens, and at
    least one; NumPy or TF."""
    encoded = encoder_frames(frames, encoder)
    return (encoded >= tokens) & (encoded >= 1)


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
    if config.time_width_frames > 0:
        max_width = tf.minimum(tf.cast(length, tf.int32), config.time_width_frames)
    else:
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


def index_shards(
    files: list[str], encoder=None, name: str | None = None, audio: OnTheFly | None = None
) -> RecordIndex:
    """The usable records of `files` (enough frames of `encoder` for their tokens; audio
    shards read with `audio`: at the fastest speed), located by byte offset, with their
    counts from the `*.lengths.json` side files. With `name` (the shard directory, for the
    message) an index with no usable record is an `InputError`."""

    def counts(path):
        index = lengths_index(path)
        samples = index.get("samples")
        return (np.asarray(index["frames"], np.int64), np.asarray(index["tokens"], np.int64),
                None if samples is None else np.asarray(samples, np.int64))  # fmt: skip

    def keep(frames, tokens, samples):
        if audio is not None:
            frames = fastest_frames(samples, audio)
        return enough_frames(frames, tokens, encoder)

    index = index_records(sorted(str(f) for f in files), counts, keep)
    if audio is not None and index.samples is not None:  # what plans buckets and memory
        index = index._replace(frames=slowest_frames(index.samples, audio))
    if name is not None and index.frames.size == 0:
        factor = 4 if encoder is None else encoder.frames_per_output
        raise InputError(
            f"{name}: none of its {index.unusable} utterance(s) has as many encoder frames "
            f"(one per {10 * factor} ms) as tokens, so none can be trained on: use a "
            "tokenizer with longer pieces (a larger vocabulary) or an encoder that "
            "subsamples less"
        )
    return index


def prefetched_micro_batches() -> int:
    """Micro-batches the pipeline holds at most — the one being assembled and the prefetched
    ones, each at most `batch_seconds` of features — plus one for the `PREPARED_AHEAD`
    utterances read and prepared beyond them (audio shards: up to 33, each ~1 MB at 30 s):
    its host memory bound."""
    return 2 + _PREFETCH


_PREFETCH = 2
_PARALLEL = 4  # utterances parsed and augmented at once (a bounded read-ahead)
# Audio shards compute each utterance's features: as many at once as there are cores (at
# most 16; each in flight is one utterance's audio and features, ~1 MB per 30 s).
_PARALLEL_AUDIO = max(_PARALLEL, min(16, len(os.sched_getaffinity(0))))
# No tf.data autotuning: every buffer and parallelism above is fixed, and the autotuning
# thread made destroying a spent iterator block for up to a minute (TF 2.21; measured in
# the mini recipe: "releasing" an epoch's iterator took 56 s, stalling the dev decode or
# the next epoch wherever the garbage collector happened to free it; 3 of 10 epochs lost
# 35-41 s each).
_OPTIONS = tf.data.Options()
_OPTIONS.autotune.enabled = False
PREPARED_AHEAD = 2 * _PARALLEL + 1  # in the parallel map and its output, and the reader's


def without_autotuning(dataset: tf.data.Dataset) -> tf.data.Dataset:
    """`dataset` with tf.data's autotuning off, as every asrkit pipeline runs: `fit` on an
    autotuned dataset waits at each epoch's end for the autotuning thread (0.8 s after a
    2 s epoch, 7 s after a 14 s one, up to a minute after long ones)."""
    return dataset.with_options(_OPTIONS)


def epoch_speeds_and_lengths(
    index: RecordIndex, audio: OnTheFly | None, *, training: bool, seed: int, epoch: int
) -> tuple[np.ndarray, np.ndarray]:
    """Each record's speed factor in this epoch (drawn from `audio.speeds` in training, 1
    otherwise and for feature shards, whose speeds are separate records) and its feature
    frames at that speed."""
    if audio is None:
        return np.ones(len(index.frames)), index.frames
    if index.samples is None:
        raise InputError(f"{index.files[0]}: not an audio shard (no sample counts)")
    if training:
        speeds = epoch_speeds(len(index.frames), audio.speeds, order_seed(seed, epoch))
    else:
        speeds = np.ones(len(index.frames))
    return speeds, epoch_frames(index.samples, speeds, audio.features)


def epoch_lengths(
    index: RecordIndex, audio: OnTheFly | None, *, training: bool, seed: int, epoch: int
) -> np.ndarray:
    """Each record's feature frames in this epoch (audio shards: at its drawn speed)."""
    when = {"training": training, "seed": seed, "epoch": epoch}
    return epoch_speeds_and_lengths(index, audio, **when)[1]


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
    index: RecordIndex | None = None,
    audio: OnTheFly | None = None,
) -> tf.data.Dataset:
    """Micro-batches of `Batch` in `epoch_order` (training: shuffled and augmented as a
    function of (seed, epoch); otherwise file order, as they are). Records are read by byte
    offset, micro-batch by micro-batch, starting after `skip_batches`: nothing before it is
    read. Pass `index` (from `index_shards`) to save re-scanning the shard headers. Audio
    shards need `audio`: their features are computed here, at the epoch's speeds."""
    index = index if index is not None else index_shards(files, audio=audio)
    when = {"training": training, "seed": seed, "epoch": epoch}
    speeds, frames = epoch_speeds_and_lengths(index, audio, **when)
    speeds = speeds.astype(np.float32)
    plan = epoch_order(frames, boundaries, batch_sizes, seed=seed, epoch=epoch,
                       shuffle=training)[skip_batches:]  # fmt: skip
    key_seed = order_seed(seed, epoch)
    augment = config.spec_augment if training else None
    warp = config.freq_warp if training else 0.0

    def read():
        with _RecordReader(index.files) as reader:
            for number, batch in enumerate(plan):
                for i in batch:
                    record = reader.read(index.file[i], index.offset[i], index.size[i])
                    yield record, i, number, speeds[i]

    def prepare(record, position, number, speed):
        # The transcript is for scoring (decoding), not training.
        e = _without_text(parse_example(record, num_mel_bins, audio, speed))
        key = tf.stack([tf.constant(key_seed, tf.int64), position])
        features = e["features"]
        if warp > 0:
            draw = tf.random.experimental.stateless_fold_in(key, 7)
            factor = tf.random.stateless_uniform([], draw, 1.0 - warp, 1.0 + warp)
            features = frequency_warp(features, factor)
        if normalize is not None:
            features = normalize(features)
        if augment is not None:
            features = spec_augment(features, e["feature_lengths"], augment, key)
        return {**e, "features": features, "batch": number}

    padded_shapes = {"id": [], "features": [None, num_mel_bins], "feature_lengths": [],
                     "labels": [None], "label_lengths": [], "duration": [],
                     "batch": []}  # fmt: skip
    sizes = tf.constant([len(b) for b in plan] or [1], tf.int64)
    dataset = tf.data.Dataset.from_generator(
        read,
        output_signature=(tf.TensorSpec([], tf.string), tf.TensorSpec([], tf.int64),
                          tf.TensorSpec([], tf.int64), tf.TensorSpec([], tf.float32)),
    )  # fmt: skip
    parallel = _PARALLEL if audio is None else _PARALLEL_AUDIO
    dataset = dataset.map(prepare, num_parallel_calls=parallel, deterministic=True)
    # A micro-batch's utterances arrive together and fill its window exactly: each window
    # is emitted as soon as its last utterance is prepared.
    dataset = dataset.group_by_window(
        key_func=lambda e: e["batch"],
        reduce_func=lambda number, window: window.padded_batch(
            sizes[tf.cast(number, tf.int32)], padded_shapes=padded_shapes
        ),
        window_size_func=lambda number: sizes[tf.cast(number, tf.int32)],
    )
    dataset = dataset.map(lambda b: _pad_to_bucket(b, boundaries, config.label_pad_multiple))
    return without_autotuning(dataset.prefetch(_PREFETCH))


class _RecordReader:
    """Reads records by byte offset, keeping the shards it touched open."""

    def __init__(self, files: list[str]):
        self.files, self.handles = files, {}

    def read(self, file: int, offset: int, size: int) -> bytes:
        handle = self.handles.get(file)
        if handle is None:
            handle = self.handles[file] = open(self.files[file], "rb")  # noqa: SIM115
        handle.seek(int(offset))
        data = handle.read(int(size))
        if len(data) != size:
            raise ValueError(f"{self.files[file]}: record at byte {offset} is truncated")
        return data

    def __enter__(self):
        return self

    def __exit__(self, *_):
        for handle in self.handles.values():
            handle.close()


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


def for_every_worker(dataset: tf.data.Dataset) -> tf.data.Dataset:
    """A training dataset as the trainer distributes it: every worker reads the same global
    micro-batches and takes its slice of each, so all workers run the same number of steps
    (file sharding would not). Adds no autotuning (see `make_dataset`)."""
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.DATA
    return dataset.with_options(options)
