"""Atomic checkpoints of model + optimizer + training progress, keeping the last K.

Each checkpoint is a directory `ckpt-<updates>` holding a tf.train.Checkpoint and
`state.json`; it is written under a temporary name and renamed when complete, so a run
killed at any moment leaves only whole checkpoints behind.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
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
        return list_checkpoints(self.directory)

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


def list_checkpoints(directory: str | os.PathLike) -> list[Path]:
    """The complete checkpoints of a directory, oldest first (read-only: safe while a
    training run writes there, unlike constructing a `CheckpointManager`)."""
    found = [p for p in Path(directory).glob("ckpt-*") if (p / "state.json").exists()]
    return sorted(found, key=lambda p: int(p.name.split("-")[1]))


def last_checkpoints(directory: str | os.PathLike, n: int) -> list[Path]:
    """The newest `n` complete checkpoints of a directory, oldest first; an error that says
    why when there are not that many."""
    if n < 1:
        raise ValueError(f"the number of checkpoints must be >= 1, got {n}")
    found = list_checkpoints(directory)
    if not found:
        raise FileNotFoundError(f"{directory}: no checkpoint")
    if len(found) < n:
        raise ValueError(
            f"{directory}: {len(found)} checkpoint(s), cannot average the last {n} "
            "(train.keep_checkpoints limits how many are kept)"
        )
    return found[-n:]


def average_last(exp_dir: str | os.PathLike, last: int, out: str | os.PathLike | None = None):
    """Averages an experiment's last `last` checkpoints into `out` (default
    `<exp_dir>/averaged/last<N>-<final checkpoint>`); returns (path, sources)."""
    exp_dir = Path(exp_dir)
    sources = last_checkpoints(exp_dir / "checkpoints", last)
    state = TrainState(**json.loads((sources[-1] / "state.json").read_text()))
    out = Path(out) if out else exp_dir / "averaged" / f"last{last}-{sources[-1].name}"
    out.parent.mkdir(parents=True, exist_ok=True)
    write_weights(out, average_checkpoints(sources), state)
    (out / "averaged.json").write_text(json.dumps([str(p) for p in sources], indent=1) + "\n")
    return out, sources


def restore(model, path: str | os.PathLike, with_optimizer: bool = True) -> TrainState:
    """Loads a checkpoint directory into a built model (and its optimizer)."""
    path = Path(path)
    status = _checkpoint(model, with_optimizer).read(str(path / "ckpt"))
    if with_optimizer:
        status.assert_existing_objects_matched()
    else:
        status.expect_partial()
    return TrainState(**json.loads((path / "state.json").read_text()))


def average_checkpoints(paths: list[str | os.PathLike]) -> list[np.ndarray]:
    """The model variables of several checkpoints, averaged.

    Floating-point variables are summed in float64 and cast back to their stored dtype;
    integer ones (dropout RNG states, counters) are taken from the last checkpoint.
    """
    if not paths:
        raise ValueError("average_checkpoints: no checkpoints given")
    readers = [tf.train.load_checkpoint(str(Path(p) / "ckpt")) for p in paths]
    keys = _variable_keys(readers[-1])
    for path, reader in zip(paths, readers, strict=True):
        if _variable_keys(reader) != keys:
            raise ValueError(f"{path}: its variables differ from {paths[-1]}'s (another model?)")
    values = []
    for key in keys:
        last = readers[-1].get_tensor(key)
        if not np.issubdtype(last.dtype, np.floating):
            values.append(last)
            continue
        total = np.zeros(last.shape, np.float64)
        for reader in readers:
            value = reader.get_tensor(key)
            if value.shape != last.shape:
                raise ValueError(f"{key}: shape {value.shape} != {last.shape} across checkpoints")
            total += value.astype(np.float64)
        values.append((total / len(readers)).astype(last.dtype))
    return values


def assign_weights(model, values: list[np.ndarray]) -> None:
    """Loads `average_checkpoints` output (creation-order values) into a built model."""
    if len(values) != len(model.variables):
        raise ValueError(f"{len(values)} values for a model with {len(model.variables)} variables")
    for var, value in zip(model.variables, values, strict=True):
        if tuple(var.shape) != value.shape:
            raise ValueError(f"{var.path}: shape {tuple(var.shape)} != {value.shape}")
        var.assign(value)


def write_weights(
    directory: str | os.PathLike, values: list[np.ndarray], state: TrainState
) -> Path:
    """A weights-only checkpoint (no optimizer) that `restore(..., with_optimizer=False)`,
    `asrkit decode --checkpoint` and `--init-from` read; written atomically."""
    final = Path(directory)
    tmp = final.with_name(final.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    variables = [tf.Variable(v, trainable=False) for v in values]
    tf.train.Checkpoint(variables=variables).write(str(tmp / "ckpt"))
    (tmp / "state.json").write_text(json.dumps(asdict(state)) + "\n")
    shutil.rmtree(final, ignore_errors=True)
    os.replace(tmp, final)
    return final


def _variable_keys(reader) -> list[str]:
    pattern = re.compile(r"^variables/(\d+)/\.ATTRIBUTES/VARIABLE_VALUE$")
    found = {}
    for key in reader.get_variable_to_shape_map():
        match = pattern.match(key)
        if match:
            found[int(match.group(1))] = key
    return [found[i] for i in sorted(found)]


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
