"""The order of an epoch, planned from the shards' side files before any record is read.

A training epoch is a list of micro-batches, each a list of utterances, computed with NumPy
from the `*.lengths.json` frame/token counts and the records' byte offsets:

1. the usable utterances (enough encoder frames for their tokens) in a permutation that
   is a pure function of (seed, epoch) — global, not a window of a shuffle buffer;
2. bucketing by length as the stream would do it: each utterance joins its bucket, and a
   bucket that reaches its batch size becomes the next micro-batch; what is left in the
   buckets at the end of the epoch follows, shortest bucket first.

So the pipeline never holds more than the micro-batches it prefetches (host memory is a few
micro-batches, not a shuffle buffer of parsed features), and resuming after micro-batch k
reads only the micro-batches after k. `DataPlanKey` names what the order depends on, so a
resume with other shards, buckets, budget or seed is caught (`changed_keys`).
"""

from __future__ import annotations

import hashlib
import json
import math
import struct
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import NamedTuple

import numpy as np

# TFRecord framing: uint64 length, uint32 masked CRC of the length, data, uint32 CRC.
_HEADER = struct.Struct("<QI")
_FOOTER_BYTES = 4


class RecordIndex(NamedTuple):
    """Every usable record of a shard set, in file order."""

    files: list[str]
    file: np.ndarray  # [N] int32, index into files
    offset: np.ndarray  # [N] int64, byte offset of the record's data
    size: np.ndarray  # [N] int64, bytes of the record's data
    frames: np.ndarray  # [N] int64
    tokens: np.ndarray  # [N] int64
    unusable: int  # records left out by `keep`
    samples: np.ndarray | None = None  # [N] int64, audio shards: each record's samples


@dataclass(frozen=True)
class DataPlanKey:
    """What an epoch's order is a function of (besides the epoch number)."""

    shards: str  # digest of the shard names and sizes
    boundaries: tuple[int, ...]
    batch_sizes: tuple[int, ...]
    seed: int

    def as_dict(self) -> dict:
        return {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(self).items()}

    @classmethod
    def from_dict(cls, data: dict) -> DataPlanKey:
        return cls(
            shards=data["shards"], boundaries=tuple(data["boundaries"]),
            batch_sizes=tuple(data["batch_sizes"]), seed=int(data["seed"]),
        )  # fmt: skip


def changed_keys(recorded: DataPlanKey, current: DataPlanKey) -> list[str]:
    """What differs, in words a user can act on."""
    words = {
        "shards": "the training shards (files or their sizes)",
        "boundaries": "the length buckets (data.num_buckets, or the shards)",
        "batch_sizes": "the micro-batch sizes (data.batch_seconds, or the replica count)",
        "seed": "train.seed",
    }
    old, new = recorded.as_dict(), current.as_dict()
    return [words[k] for k in words if old[k] != new[k]]


def record_offsets(path: str | Path) -> tuple[np.ndarray, np.ndarray]:
    """Byte offset and size of every record's data in a TFRecord file (headers only read)."""
    offsets, sizes = [], []
    with open(path, "rb") as f:
        end = f.seek(0, 2)
        position = 0
        while position < end:
            f.seek(position)
            header = f.read(_HEADER.size)
            if len(header) < _HEADER.size:
                raise ValueError(f"{path}: truncated record header at byte {position}")
            (length, _crc) = _HEADER.unpack(header)
            offsets.append(position + _HEADER.size)
            sizes.append(length)
            position += _HEADER.size + length + _FOOTER_BYTES
        if position != end:
            raise ValueError(f"{path}: truncated last record")
    return np.array(offsets, np.int64), np.array(sizes, np.int64)


def index_records(files: list[str], frames_of, keep) -> RecordIndex:
    """Joins each shard's byte offsets with its side file's counts; `frames_of(file)` gives
    (frames, tokens, samples or None) arrays, `keep(frames, tokens, samples)` the usable
    records."""
    parts, unusable = [], 0
    for number, path in enumerate(files):
        offsets, sizes = record_offsets(path)
        frames, tokens, samples = frames_of(path)
        samples = np.full(len(frames), -1, np.int64) if samples is None else samples
        if len(frames) != len(offsets):
            raise ValueError(
                f"{path}: {len(offsets)} records but its lengths.json lists {len(frames)}; "
                "delete the shard and its side files and re-run `asrkit features extract`"
            )
        usable = np.asarray(keep(frames, tokens, samples), bool)
        parts.append((np.full(usable.sum(), number, np.int32), offsets[usable], sizes[usable],
                      frames[usable], tokens[usable], samples[usable]))  # fmt: skip
        unusable += int((~usable).sum())
    if not parts:
        raise ValueError("no shard files")
    stacked = [np.concatenate([p[i] for p in parts]) for i in range(6)]
    samples = stacked.pop()
    return RecordIndex(list(files), *stacked, unusable, None if (samples < 0).any() else samples)


def index_bytes(index: RecordIndex) -> int:
    arrays = (index.file, index.offset, index.size, index.frames, index.tokens, index.samples)
    return sum(a.nbytes for a in arrays if a is not None)


def shards_digest(files: list[str]) -> str:
    listing = [(Path(f).name, Path(f).stat().st_size) for f in sorted(files)]
    return hashlib.sha256(json.dumps(listing).encode()).hexdigest()[:16]


def bucket_index(frame_lengths, boundaries: list[int]) -> np.ndarray:
    """The bucket of each length under `bucket_plan`'s boundaries (as tf.data buckets them:
    bucket i holds [boundaries[i-1], boundaries[i]); len(boundaries) is the overflow)."""
    return np.searchsorted(np.asarray(boundaries), np.asarray(frame_lengths), side="right")


def micro_batches_per_epoch(frame_lengths, plan: tuple[list[int], list[int]]) -> int:
    """How many micro-batches `epoch_order` forms from these lengths, whatever the order."""
    boundaries, sizes = plan
    counts = np.bincount(bucket_index(frame_lengths, boundaries), minlength=len(boundaries) + 1)
    return int(sum(math.ceil(c / s) for c, s in zip(counts, [*sizes, 1], strict=True)))


def order_seed(seed: int, epoch: int) -> int:
    """The one integer the epoch's permutation and augmentation keys derive from."""
    return seed * 100_003 + epoch


def epoch_order(
    frames: np.ndarray, boundaries: list[int], batch_sizes: list[int], *, seed: int,
    epoch: int, shuffle: bool = True,
) -> list[np.ndarray]:  # fmt: skip
    """Micro-batches (arrays of indices into `frames`) of one epoch, in training order.

    Bucket i holds lengths in [boundaries[i-1], boundaries[i]) with batch_sizes[i]
    utterances; longer ones go one by one. Without `shuffle`: file order.
    """
    frames = np.asarray(frames)
    if shuffle:
        permutation = np.random.default_rng(order_seed(seed, epoch)).permutation(len(frames))
    else:
        permutation = np.arange(len(frames))
    buckets = bucket_index(frames[permutation], boundaries)
    sizes = [*batch_sizes, 1]
    pending: list[list[int]] = [[] for _ in sizes]
    batches: list[np.ndarray] = []
    for index, bucket in zip(permutation.tolist(), buckets.tolist(), strict=True):
        waiting = pending[bucket]
        waiting.append(index)
        if len(waiting) == sizes[bucket]:
            batches.append(np.array(waiting, np.int64))
            waiting.clear()
    batches += [np.array(w, np.int64) for w in pending if w]
    return batches
