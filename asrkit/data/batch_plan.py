"""Micro-batch sizes per length bucket: from the audio budget (`data.batch_seconds`), or
from a memory plan (`asrkit plan`, `data.plan`) that measured the largest micro-batch of
each bucket that fits a device's memory.

A plan file is JSON. Per bucket it records the exclusive upper frame count, the label
length it was measured with, the chosen utterances per replica, the measured peak bytes at
that size and one utterance more, and a fitted line (fixed + per-utterance bytes). It also
records what the measurement depends on (model, precision, features, label padding, XLA),
so a plan measured for another model is refused rather than trusted.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from asrkit.config import ExperimentConfig
from asrkit.data.order import bucket_index, micro_batches_per_epoch
from asrkit.data.pipeline import bucket_plan, pipeline_config
from asrkit.errors import UserError

PLAN_FORMAT = 1


class PlanError(UserError, ValueError):
    """A plan that cannot be used with this config or these shards; says what to do."""


@dataclass(frozen=True)
class PlannedBucket:
    boundary: int  # exclusive upper feature-frame count; padded to boundary - 1
    tokens: int  # label length the bucket was measured with (its longest, padded)
    utterances: int  # in the training shards when planned
    micro_batch: int  # utterances per replica per micro-batch
    measured_bytes: int  # peak device memory of a training step at micro_batch
    # ... at micro_batch + 1 (-1: out of memory; None: not measured, micro_batch is the
    # bucket's utterances or one update's audio)
    over_bytes: int | None
    fixed_bytes: float  # the fitted line: peak ≈ fixed + per_utterance × utterances
    per_utterance_bytes: float


@dataclass(frozen=True)
class MemoryPlan:
    device: str
    budget_bytes: int
    margin: float  # fraction of the budget kept free
    buckets: tuple[PlannedBucket, ...]
    measured_for: dict  # memory_fingerprint(config) of the measuring run
    frame_step_seconds: float

    @property
    def usable_bytes(self) -> int:
        return int(self.budget_bytes * (1 - self.margin))

    def sizes(self, replicas: int = 1) -> tuple[list[int], list[int]]:
        """(boundaries, global micro-batch sizes) as the input pipeline takes them."""
        return [b.boundary for b in self.buckets], [b.micro_batch * replicas for b in self.buckets]

    def to_json(self) -> str:
        return json.dumps({"format": PLAN_FORMAT, **dataclasses.asdict(self)}, indent=1)

    @classmethod
    def from_json(cls, text: str) -> MemoryPlan:
        data = json.loads(text)
        if data.pop("format", None) != PLAN_FORMAT:
            raise ValueError(f"not a format-{PLAN_FORMAT} asrkit plan")
        data["buckets"] = tuple(PlannedBucket(**b) for b in data["buckets"])
        return cls(**data)


def save_plan(plan: MemoryPlan, path: str | os.PathLike) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(plan.to_json() + "\n")
    os.replace(tmp, path)
    return path


def load_plan(path: str | os.PathLike) -> MemoryPlan:
    path = Path(path)
    text = path.read_text()  # a missing file is the CLI's FileNotFoundError, named
    try:
        return MemoryPlan.from_json(text)
    except (ValueError, TypeError, KeyError) as err:
        raise PlanError(
            f"data.plan: {path} is not a plan made by `asrkit plan` ({err}); make one with "
            "`asrkit plan --config ... --memory ...`"
        ) from None


def memory_fingerprint(config: ExperimentConfig) -> dict:
    """What a training step's memory depends on besides the micro-batch shape."""
    fingerprint = {
        "model": dataclasses.asdict(config.model),
        "loss": dataclasses.asdict(config.loss),
        "precision": config.train.precision,
        "optimizer": config.train.optimizer,
        "freeze_encoder": config.train.freeze_encoder,
        "jit_compile": config.train.jit_compile,
        "num_mel_bins": config.features.num_mel_bins,
        "label_pad_multiple": config.data.label_pad_multiple,
    }
    return json.loads(json.dumps(fingerprint))  # as a plan file holds it (lists, not tuples)


def micro_batch_plan(
    config: ExperimentConfig, frames, tokens, replicas: int = 1
) -> tuple[list[int], list[int]]:
    """Bucket boundaries and global micro-batch sizes for training: the config's memory
    plan if it names one (checked against this config and these utterances), else the
    audio budget `data.batch_seconds` per replica."""
    if not config.data.plan:
        return bucket_plan(frames, pipeline_config(config, replicas))
    plan = load_plan(config.data.plan)
    check_plan(plan, config, frames, tokens, config.data.plan)
    return plan.sizes(replicas)


def check_plan(plan: MemoryPlan, config: ExperimentConfig, frames, tokens, where) -> None:
    changed = _differences(plan.measured_for, memory_fingerprint(config))
    if changed:
        raise PlanError(
            f"data.plan: {where} was measured for other settings (changed: "
            f"{', '.join(changed[:6])}); make a new plan with `asrkit plan` for this config"
        )
    frames, tokens = np.asarray(frames), np.asarray(tokens)
    boundaries = [b.boundary for b in plan.buckets]
    if frames.size and int(frames.max()) >= boundaries[-1]:
        raise PlanError(
            f"data.plan: {where} covers utterances up to {_seconds(plan, boundaries[-1] - 1)}, "
            f"the training shards have one of {_seconds(plan, int(frames.max()))}; make a new "
            "plan with `asrkit plan` on these shards"
        )
    buckets = bucket_index(frames, boundaries)
    multiple = config.data.label_pad_multiple
    for index, bucket in enumerate(plan.buckets):
        members = tokens[buckets == index]
        if members.size and math.ceil(members.max() / multiple) * multiple > bucket.tokens:
            raise PlanError(
                f"data.plan: {where} measured the bucket of utterances up to "
                f"{_seconds(plan, bucket.boundary - 1)} with {bucket.tokens} tokens, the "
                f"training shards have {int(members.max())} there; make a new plan with "
                "`asrkit plan` on these shards"
            )


def mean_micro_batch_seconds(frames, plan: tuple[list[int], list[int]], step: float) -> float:
    """Audio per micro-batch over an epoch, padding included (as `data.batch_seconds`)."""
    boundaries = plan[0]
    counts = np.bincount(bucket_index(np.asarray(frames), boundaries), minlength=len(boundaries))
    padded = sum(int(c) * (b - 1) for c, b in zip(counts, boundaries, strict=False))
    return padded * step / max(micro_batches_per_epoch(frames, plan), 1)


def _differences(recorded: dict, current: dict, prefix: str = "") -> list[str]:
    keys = sorted(set(recorded) | set(current))
    out = []
    for key in keys:
        a, b = recorded.get(key), current.get(key)
        if isinstance(a, dict) and isinstance(b, dict):
            out += _differences(a, b, f"{prefix}{key}.")
        elif a != b:
            out.append(f"{prefix}{key}")
    return out


def _seconds(plan: MemoryPlan, frames: int) -> str:
    return f"{frames * plan.frame_step_seconds:.1f} s"
