"""`asrkit plan`: for each length bucket, the largest micro-batch whose training step fits
a device memory budget — measured, not estimated — and the accumulation that then reaches
`train.effective_batch_seconds`.

Each bucket is measured at its worst shape: padded to its boundary, with its most tokens
(padded as the pipeline pads labels). Peak memory grows with the utterances of a
micro-batch almost on a line, so the search measures 1 and 2 utterances, fits the line,
measures where it crosses the usable budget (the budget less a safety margin) and walks
from there until it holds both the largest size that fits and the next size, which does
not (or the bucket is whole). Buckets are planned longest first, and each next one starts
where the previous one's line, scaled to its frames, crosses the budget: a right guess
costs two measurements (on a CPU, at 0.6 B parameters, each is a training step of up to a
minute). The fitted line is kept in the plan: it predicts other budgets
(the LibriSpeech README's per-GPU table) without measuring on that card.
"""

from __future__ import annotations

import math
import os
import shutil
import subprocess
from dataclasses import dataclass

import numpy as np

from asrkit.config import ExperimentConfig
from asrkit.data.batch_plan import (
    MemoryPlan,
    PlannedBucket,
    mean_micro_batch_seconds,
    memory_fingerprint,
)
from asrkit.data.order import bucket_index, micro_batches_per_epoch
from asrkit.data.pipeline import bucket_plan, pipeline_config
from asrkit.errors import UserError
from asrkit.sizes import format_bytes
from asrkit.training.setup import accumulation_steps

DEFAULT_MARGIN = 0.15  # covers the allocator's history effect (memory_meter)
_MAX_MEASUREMENTS = 16  # per bucket; the line usually needs 4


class BudgetTooSmall(UserError, ValueError):
    """Not even one utterance of a bucket fits; the message names the bucket."""


@dataclass(frozen=True)
class ProbeBucket:
    boundary: int  # exclusive upper frame count; measured padded to boundary - 1
    tokens: int  # the bucket's most tokens, padded to data.label_pad_multiple
    utterances: int  # in the training shards


@dataclass(frozen=True)
class PlanSummary:
    """What a plan means for an epoch, for `replicas` devices."""

    micro_batch_seconds: float  # epoch mean, padding included
    accumulation_steps: int
    effective_batch_seconds: float
    micro_batches_per_epoch: int
    updates_per_epoch: int


def check_margin(margin: float) -> None:
    if not 0 <= margin < 1:
        raise UserError(f"the safety margin must be in [0, 1), got {margin}")


def probe_buckets(config: ExperimentConfig, frames, tokens) -> list[ProbeBucket]:
    """The training config's length buckets, each with its worst shape."""
    frames, tokens = np.asarray(frames), np.asarray(tokens)
    boundaries, _ = bucket_plan(frames, pipeline_config(config))
    index = bucket_index(frames, boundaries)
    multiple = config.data.label_pad_multiple
    buckets = []
    for i, boundary in enumerate(boundaries):
        members = tokens[index == i]
        if members.size:
            padded = max(multiple, math.ceil(int(members.max()) / multiple) * multiple)
            buckets.append(ProbeBucket(boundary, padded, int(members.size)))
    return buckets


def largest_fitting(
    peak, usable: int, limit: int, guess: int | None = None
) -> tuple[int, dict[int, float]]:
    """The largest n in [1, limit] with peak(n) <= usable (0 if none), assuming peak grows
    with n; peak(n) is bytes or None for out-of-memory. Returns n and every measurement.
    `guess`: a predicted answer (from the previous bucket's line): measured first with its
    neighbour, so a right guess costs two measurements instead of a search from 1."""
    points: dict[int, float] = {}

    def fits(n: int) -> bool:
        if n not in points:
            value = peak(n)
            points[n] = math.inf if value is None else float(value)
        return points[n] <= usable

    low, high = 1, limit + 1  # peak(low) fits; high: the smallest size known not to
    guess = None if guess is None else min(guess, limit)
    if guess is not None and guess > 1:
        if fits(guess):
            if guess == limit or not fits(guess + 1):
                return guess, points
            low = guess + 1
        else:
            high = guess
            if fits(guess - 1):
                return guess - 1, points
            high = guess - 1
    if low == 1 and not fits(1):
        return 0, points
    while high - low > 1:
        if len(points) >= _MAX_MEASUREMENTS:
            guess = (low + high) // 2
        else:
            guess = min(max(_secant(points, usable, low, high), low + 1), high - 1)
        if fits(guess):
            low = guess
        else:
            high = guess
    return low, points


def _guess(line, usable: int, bucket) -> int | None:
    """The size the longer bucket's line predicts for this one: its bytes per utterance
    scaled by the frames (activations grow with them), its fixed bytes kept."""
    if line is None:
        return None
    fixed, slope, frames = line
    per_utterance = slope * (bucket.boundary - 1) / frames
    return max(1, math.floor((usable - fixed) / per_utterance)) if per_utterance > 0 else None


def _secant(points: dict[int, float], usable: int, low: int, high: int) -> int:
    """Where the line through the two measurements nearest the crossing meets `usable`."""
    if high in points and math.isfinite(points[high]):
        other = high
    else:  # the largest other size that was measured and fitted
        other = max((n for n, v in points.items() if n != low and v <= usable), default=None)
    if other is None:
        return 2 * low  # one point: double
    slope = (points[other] - points[low]) / (other - low)
    if slope <= 0:
        return high - 1
    return low + math.floor((usable - points[low]) / slope)


def fit_line(points: dict[int, float]) -> tuple[float, float]:
    """Least-squares (fixed, per utterance) bytes through the finite measurements."""
    sizes = np.array([n for n, v in points.items() if math.isfinite(v)], float)
    values = np.array([v for v in points.values() if math.isfinite(v)], float)
    if sizes.size < 2 or np.ptp(sizes) == 0:
        return float(values.max(initial=0.0)), 0.0
    slope, fixed = np.polyfit(sizes, values, 1)
    return float(fixed), float(slope)


def plan_memory(
    config: ExperimentConfig,
    frames,
    tokens,
    meter,
    budget: int,
    margin: float = DEFAULT_MARGIN,
    log=print,
) -> MemoryPlan:
    """Measures each bucket with `meter` (a `MemoryMeter`, or anything with `peak` and
    `baseline`) and returns the plan; `BudgetTooSmall` names a bucket that cannot fit.
    A micro-batch never holds more than a bucket's utterances, nor more audio than
    `train.effective_batch_seconds` (one update)."""
    check_margin(margin)
    usable = int(budget * (1 - margin))
    step = pipeline_config(config).frame_step_seconds
    if meter.baseline > usable:
        raise BudgetTooSmall(
            f"the model's weights, optimizer state and accumulation buffers alone take "
            f"{format_bytes(meter.baseline)}, more than the usable {format_bytes(usable)}"
        )
    planned = []
    line = None  # the previous (longer) bucket's fitted (fixed, per utterance, frames)
    for bucket in reversed(probe_buckets(config, frames, tokens)):  # the longest first
        seconds = (bucket.boundary - 1) * step

        def peak(n, bucket=bucket):
            return meter.peak(n, bucket.boundary - 1, bucket.tokens)

        limit = bucket.utterances
        if config.train.effective_batch_seconds:  # never more than one update's audio
            limit = min(limit, max(1, int(config.train.effective_batch_seconds // seconds)))
        size, points = largest_fitting(peak, usable, limit, _guess(line, usable, bucket))
        if size == 0:
            raise BudgetTooSmall(
                f"the bucket of utterances up to {seconds:.1f} s ({bucket.tokens} tokens) needs "
                f"{format_bytes(points[1])} for one utterance, more than the usable "
                f"{format_bytes(usable)} ({format_bytes(budget)} less the {margin:.0%} "
                "margin): give more --memory, a smaller --margin, or a smaller model"
            )
        fixed, slope = fit_line(points)
        if slope > 0:
            line = (fixed, slope, bucket.boundary - 1)
        over = points.get(size + 1) if size < limit else None
        planned.append(
            PlannedBucket(
                boundary=bucket.boundary, tokens=bucket.tokens, utterances=bucket.utterances,
                micro_batch=size, measured_bytes=int(points[size]),
                over_bytes=None if over is None else (-1 if math.isinf(over) else int(over)),
                fixed_bytes=fixed, per_utterance_bytes=slope,
            )
        )  # fmt: skip
        log(
            f"  bucket <= {seconds:5.1f} s: {size} utterance(s) per micro-batch "
            f"({format_bytes(points[size])}; {len(points)} measurements)"
        )
    return MemoryPlan(
        device=getattr(meter, "device", "?"), budget_bytes=int(budget), margin=float(margin),
        buckets=tuple(sorted(planned, key=lambda b: b.boundary)),
        measured_for=memory_fingerprint(config), frame_step_seconds=step,
    )  # fmt: skip


def summarize(plan: MemoryPlan, config: ExperimentConfig, frames, replicas: int = 1):
    """Accumulation, micro-batches and updates of an epoch trained with `plan`."""
    sizes = plan.sizes(replicas)
    seconds = mean_micro_batch_seconds(frames, sizes, plan.frame_step_seconds)
    steps = accumulation_steps(config, replicas, seconds)
    micro = micro_batches_per_epoch(frames, sizes)
    return PlanSummary(seconds, steps, steps * seconds, micro, math.ceil(micro / steps))


def predicted_micro_batch(bucket: PlannedBucket, budget: int, margin: float) -> int:
    """The fitted line's micro-batch for another budget (capped at the bucket)."""
    usable = budget * (1 - margin)
    if bucket.per_utterance_bytes <= 0:
        return bucket.utterances if bucket.fixed_bytes <= usable else 0
    n = math.floor((usable - bucket.fixed_bytes) / bucket.per_utterance_bytes)
    return max(0, min(n, bucket.utterances))


def device_capacity(device: str) -> int:
    """The memory of `device`: the host's RAM for a CPU, nvidia-smi's total for a GPU."""
    kind, _, index = device.upper().partition(":")
    if kind == "CPU":
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    smi = shutil.which("nvidia-smi")
    if smi:
        out = subprocess.run(
            [smi, "--query-gpu=memory.total", "--format=csv,noheader,nounits", "-i", index or "0"],
            capture_output=True, text=True, check=False,
        )  # fmt: skip
        if out.returncode == 0 and out.stdout.strip().isdigit():
            return int(out.stdout.strip()) * 2**20
    raise UserError(f"cannot tell how much memory {device} has: give it with --memory")


def plan_training(
    config: ExperimentConfig,
    budget: int | None = None,
    device: str | None = None,
    margin: float = DEFAULT_MARGIN,
    emulate: bool = True,
    log=print,
) -> tuple[MemoryPlan, PlanSummary]:
    """`asrkit plan` as a call, returning the plan and what it means for an epoch on one
    device: the config's training shards and model, measured on `device` (default: the
    first GPU, else the CPU) against `budget` bytes (default: the device's memory). On a GPU
    the measuring process gets a logical device of exactly `budget` (unless `emulate` is
    false), so one large card plans for a smaller one."""
    import tensorflow as tf

    from asrkit.data.pipeline import index_shards
    from asrkit.data.records import check_shards, on_the_fly, shard_files
    from asrkit.tokenizer import Tokenizer
    from asrkit.training.memory_meter import MemoryMeter
    from asrkit.training.state_size import check_state_fits, training_state

    if device is None:
        device = "GPU:0" if tf.config.list_physical_devices("GPU") else "CPU:0"
    device = device.upper().removeprefix("/DEVICE:")
    kind, _, number = device.partition(":")
    present = len(tf.config.list_physical_devices(kind)) if kind in ("CPU", "GPU") else 0
    if not number.isdigit() or int(number) >= present:
        raise UserError(
            f"--device {device}: no such device here ({present} {kind or 'device'}(s)); "
            "use e.g. CPU:0 or GPU:0"
        )
    if budget is None:
        budget = device_capacity(device)
    check_margin(margin)
    tokenizer = Tokenizer.load(config.data.tokenizer)
    state = training_state(config, tokenizer.vocab_size)  # before any data is read
    log(f"training state: {state.describe()}")
    check_state_fits(state, budget, margin)
    check_shards(config.data.train_shards, config, tokenizer)
    audio = on_the_fly(config.data.train_shards, config.features)  # planned at its slowest
    index = index_shards(
        shard_files(config.data.train_shards), config.model.encoder, config.data.train_shards,
        audio,
    )  # fmt: skip
    limit = budget if emulate and device.startswith("GPU") else None
    log(f"measuring on {device}, budget {format_bytes(budget)}, margin {margin:.0%}")
    with MemoryMeter(config, tokenizer.vocab_size, device, limit) as meter:
        log(f"  model, optimizer state and accumulation buffers: {format_bytes(meter.baseline)}")
        plan = plan_memory(config, index.frames, index.tokens, meter, budget, margin, log)
    return plan, summarize(plan, config, index.frames)
