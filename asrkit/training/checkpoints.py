"""Atomic checkpoints of model + optimizer + training progress, keeping the last K.

Each checkpoint is a directory `ckpt-<updates>` holding a tf.train.Checkpoint and
`state.json`; it is written under a temporary name and renamed when complete, so a run
killed at any moment leaves only whole checkpoints behind.
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import asdict, dataclass
from pathlib import Path

import tensorflow as tf


@dataclass(frozen=True)
class TrainState:
    """Training progress, saved with every checkpoint (config stays immutable)."""

    epoch: int  # the epoch in progress
    micro_batches: int  # micro-batches of that epoch already consumed
    updates: int  # optimizer updates so far
    best_wer: float | None = None


class CheckpointManager:
    def __init__(self, directory: str | os.PathLike, keep: int = 3):
        self.directory = Path(directory)
        self.keep = max(1, keep)
        self.directory.mkdir(parents=True, exist_ok=True)
        for stale in self.directory.glob("*.tmp"):  # a write that was killed
            shutil.rmtree(stale, ignore_errors=True)

    def checkpoints(self) -> list[Path]:
        found = [p for p in self.directory.glob("ckpt-*") if (p / "state.json").exists()]
        return sorted(found, key=lambda p: int(p.name.split("-")[1]))

    def latest(self) -> Path | None:
        found = self.checkpoints()
        return found[-1] if found else None

    def save(self, model, state: TrainState) -> Path:
        final = self.directory / f"ckpt-{state.updates:08d}"
        if final.exists():
            shutil.rmtree(final)
        tmp = self.directory / f"ckpt-{state.updates:08d}.tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        _checkpoint(model, with_optimizer=True).write(str(tmp / "ckpt"))
        (tmp / "state.json").write_text(json.dumps(asdict(state)) + "\n")
        os.replace(tmp, final)
        for old in self.checkpoints()[: -self.keep]:
            shutil.rmtree(old, ignore_errors=True)
        return final


def restore(model, path: str | os.PathLike, with_optimizer: bool = True) -> TrainState:
    """Loads a checkpoint directory into a built model (and its optimizer)."""
    path = Path(path)
    status = _checkpoint(model, with_optimizer).read(str(path / "ckpt"))
    if with_optimizer:
        status.assert_existing_objects_matched()
    else:
        status.expect_partial()
    return TrainState(**json.loads((path / "state.json").read_text()))


def _checkpoint(model, with_optimizer: bool) -> tf.train.Checkpoint:
    """Every model variable, in creation order — non-trainable ones too (normalisation
    statistics, dropout RNG states): `tf.train.Checkpoint(model=...)` on a Keras 3 model
    reaches only the variables the optimizer tracks, and a resumed run would diverge.
    (Order, not `v.path`: paths carry per-process layer-name suffixes like `_1`.)"""
    variables = [v.value for v in model.variables]
    if with_optimizer:
        return tf.train.Checkpoint(variables=variables, optimizer=model.optimizer)
    return tf.train.Checkpoint(variables=variables)


@dataclass(frozen=True)
class LoadReport:
    loaded: list[str]
    skipped: list[tuple[str, str]]  # (variable path, why)


def load_matching_weights(model, path: str | os.PathLike) -> LoadReport:
    """Fine-tuning: copies every model variable whose shape matches the checkpoint's.

    Variables are matched in creation order (as `CheckpointManager` saves them), so the
    architecture must be the same; what differs in shape — the predictor embedding and the
    joint output layer when the tokenizer changes — keeps its fresh initialisation and is
    reported.
    """
    reader = tf.train.load_checkpoint(str(Path(path) / "ckpt"))
    shapes = reader.get_variable_to_shape_map()
    loaded, skipped = [], []
    for index, var in enumerate(model.variables):
        key = f"variables/{index}/.ATTRIBUTES/VARIABLE_VALUE"
        if key not in shapes:
            skipped.append((var.path, "not in the checkpoint"))
        elif tuple(shapes[key]) != tuple(var.shape):
            skipped.append((var.path, f"shape {tuple(shapes[key])} != {tuple(var.shape)}"))
        else:
            var.assign(reader.get_tensor(key))
            loaded.append(var.path)
    return LoadReport(loaded, skipped)
