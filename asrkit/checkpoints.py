"""Checkpoint I/O: atomic checkpoints of a model (+ optimizer) and training progress, kept K.

Sits below training and decoding: both read and write checkpoints through this module,
and nothing here imports either.

A checkpoint is a directory `ckpt-<updates>` holding a `tf.train.Checkpoint` (`ckpt.*`) of
the network's weights and (when training) the optimizer, `state.json` (training progress)
and `variables.json` (the network's variable names in trainable order). Network variables
are keyed by a stable *name*: the attribute path from the network to the variable
(`encoder.blocks.3.attention.qkv.kernel`), the same in every process whatever order the
layers were created in (Keras' own `variable.path` carries process-global suffixes such as
`dense_17` and puts dropout seed states at the top level).

Writing is complete-then-swap: a new checkpoint is written under `<name>.tmp`; an existing
one of the same name is moved to `<name>.old`, the new one renamed into place, and only
then the old one deleted. A run killed at any moment leaves a whole checkpoint of every
name behind (`CheckpointManager` puts a stranded `.old` back).

Before the swap, `files.json` records the size and SHA-256 of every file the checkpoint
holds; every reader checks them first (`verify_checkpoint`), so a truncated copy, a full
disk's partial write or a flipped bit is reported by file name instead of failing inside
TensorFlow, and `newest_intact` finds the checkpoint to use instead.

A run that trains through adapters writes *base-backed* checkpoints: the weights it
froze and took unchanged from its base checkpoint are left out, and `base.json` names the
base (its path, relative and absolute, and the SHA-256 of its `files.json`, which covers
every file of it) and the weights taken from it. Every reader fills them back in from the
base, checked against that hash, so such a checkpoint is the adapters' megabytes and
reads as the whole network.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
from dataclasses import asdict, dataclass
from pathlib import Path

import keras
import numpy as np
import tensorflow as tf

from asrkit.config import SCHEMA_VERSION
from asrkit.errors import UserError

CHECKPOINT_NAME = re.compile(r"^ckpt-(\d+)$")
HEADS_PREFIX = "loss_heads."  # a training task's loss heads, saved beside the network
FILES_RECORD = "files.json"  # {file name: {"bytes": n, "sha256": hex}} of the others
BASE_RECORD = "base.json"  # a base-backed checkpoint's `BaseRef`
_WEIGHT_KEY = re.compile(r"^weights/(.+)/\.ATTRIBUTES/VARIABLE_VALUE$")
# Keras' own bookkeeping attributes of a layer: lists and trackers that hold the same
# variables and sub-layers again. Walked last, so every variable is named by the
# attribute that owns it.
_BOOKKEEPING = frozenset(
    {"_layers", "_trainable_variables", "_non_trainable_variables", "_seed_generators",
     "_metrics", "_tracker", "_loss_tracker", "_compile_metrics", "_compile_loss",
     "_inbound_nodes", "_outbound_nodes", "_losses", "_loss_ids"}
)  # fmt: skip


class CheckpointError(UserError, RuntimeError):
    """A checkpoint that cannot be written or used; the message says which and what to do."""


@dataclass(frozen=True)
class TrainState:
    """Training progress, saved with every checkpoint (config stays immutable)."""

    epoch: int  # the epoch in progress
    micro_batches: int  # micro-batches of that epoch already consumed
    updates: int  # optimizer updates so far
    best_wer: float | None = None
    # The dev WER of these very weights (an epoch-end checkpoint of a run with dev shards;
    # None otherwise): what `train.keep_best` and `asrkit average --best` rank by.
    dev_wer: float | None = None
    # What the epoch's order is a function of (`asrkit.data.order.DataPlanKey.as_dict()`):
    # `micro_batches` counts micro-batches of that order only.
    data_plan: dict | None = None
    schema: int = SCHEMA_VERSION  # asrkit.config's; another is refused by read_state


@dataclass(frozen=True)
class BaseRef:
    """The base checkpoint a base-backed checkpoint takes its frozen weights from."""

    path: str  # absolute, as it was when the run started
    sha256: str  # of the base's files.json (which hashes each of its files)
    names: tuple[str, ...]  # the weights taken from it

    @classmethod
    def of(cls, base: str | os.PathLike, names) -> BaseRef:
        base = Path(base).resolve()
        return cls(str(base), _sha256(base / FILES_RECORD), tuple(sorted(names)))

    def write(self, directory: Path, final: Path) -> None:
        """`base.json` into `directory`, which will be renamed to `final` (the relative
        path is from there: a tree moved as a whole still finds its base)."""
        directory.mkdir(parents=True, exist_ok=True)
        record = {**asdict(self), "names": list(self.names),
                  "relative": os.path.relpath(self.path, final.resolve())}  # fmt: skip
        (directory / BASE_RECORD).write_text(json.dumps(record, indent=1) + "\n")


def checkpoint_base(path: str | os.PathLike) -> BaseRef | None:
    """The base a checkpoint takes frozen weights from (None: it holds every weight)."""
    file = Path(path) / BASE_RECORD
    if not file.is_file():
        return None
    record = json.loads(file.read_text())
    return BaseRef(record["path"], record["sha256"], tuple(record["names"]))


def _base_weights(path: Path) -> dict[str, np.ndarray]:
    """The weights a base-backed checkpoint takes from its base, found (next to it as it
    was, else at its absolute path) and checked against the recorded hash."""
    ref = checkpoint_base(path)
    relative = json.loads((path / BASE_RECORD).read_text()).get("relative")
    places = [(path / relative).resolve()] if relative else []
    places.append(Path(ref.path))
    found = next((p for p in places if (p / FILES_RECORD).is_file()), None)
    what = (
        f"{path} holds only what its run trained; the other {len(ref.names)} weights are "
        f"its base's ({ref.path}, files.json SHA-256 {ref.sha256[:12]}…)"
    )
    if found is None:
        raise CheckpointError(
            f"{what}, which is gone. Put that checkpoint back where it was (or beside this "
            "tree as it was), unchanged."
        )
    if _sha256(found / FILES_RECORD) != ref.sha256:
        raise CheckpointError(
            f"{what}; {found} is another checkpoint now (its files.json differs). Restore "
            "the base it was trained from."
        )
    base = read_weights(found)
    missing = [n for n in ref.names if n not in base]
    if missing:
        raise CheckpointError(f"{what}; the base lacks {missing[:3]} ({len(missing)})")
    return {n: base[n] for n in ref.names}


# ------------------------------------------------------------------------- variable names
def named_variables(model: keras.layers.Layer) -> dict[str, keras.Variable]:
    """Every variable of a built model under its stable attribute-path name.

    Raises if a variable of `model.variables` is reachable only through Keras' bookkeeping
    (a layer kept in a plain container the walk does not know): such a name would depend
    on creation order again.
    """
    found: dict[str, keras.Variable] = {}
    unstable: list[str] = []
    seen: set[int] = set()

    def visit(obj, name: str, bookkeeping: bool) -> None:
        if id(obj) in seen:
            return
        if isinstance(obj, keras.Variable):
            seen.add(id(obj))
            found[name] = obj
            if bookkeeping:
                unstable.append(name)
        elif isinstance(obj, keras.random.SeedGenerator):
            seen.add(id(obj))
            visit(obj.state, f"{name}.state", bookkeeping)
        elif isinstance(obj, keras.layers.Layer):
            seen.add(id(obj))
            items = sorted(vars(obj).items(), key=lambda kv: (_is_bookkeeping(kv[0]), kv[0]))
            for attr, value in items:
                child = f"{name}.{attr.lstrip('_')}" if name else attr.lstrip("_")
                visit(value, child, bookkeeping or _is_bookkeeping(attr))
        elif isinstance(obj, list | tuple):
            for index, item in enumerate(obj):
                visit(item, f"{name}.{index}", bookkeeping)
        elif isinstance(obj, dict):
            for key in sorted(obj, key=str):
                visit(obj[key], f"{name}.{key}", bookkeeping)

    visit(model, "", False)
    by_id = {id(v): k for k, v in found.items()}
    missing = [v.path for v in model.variables if id(v) not in by_id]
    if missing or any(id(found[k]) in {id(v) for v in model.variables} for k in unstable):
        raise CheckpointError(
            f"{type(model).__name__}: variables without a stable name: {missing or unstable}; "
            "keep every sub-layer in an attribute (or a list/dict attribute) of its parent"
        )
    return {by_id[id(v)]: v for v in model.variables}


def _is_bookkeeping(attr: str) -> bool:
    # `_self_*`: TensorFlow's own object tracking (`_self_unconditional_dependency_names`).
    return attr in _BOOKKEEPING or attr.startswith("_self_")


def _unescape(key: str) -> str:
    """A `tf.train.Checkpoint` dict key back from its escaped form ('.' -> '..', '/' -> '.S')."""
    return re.sub(r"\.(\.|S)", lambda m: "." if m.group(1) == "." else "/", key)


# ------------------------------------------------------------------------------ listing
def list_checkpoints(directory: str | os.PathLike) -> list[Path]:
    """The complete checkpoints `ckpt-<updates>` of a directory, oldest first (read-only:
    safe while a training run writes there, unlike constructing a `CheckpointManager`).
    Anything else there (`ckpt-…tmp`, a user's `ckpt-…bak` copy) is ignored."""
    found = []
    for path in Path(directory).glob("ckpt-*"):
        match = CHECKPOINT_NAME.match(path.name)
        if match and (path / "state.json").exists():
            found.append((int(match.group(1)), path))
    return [path for _, path in sorted(found)]


def last_checkpoints(directory: str | os.PathLike, n: int) -> list[Path]:
    """The newest `n` complete checkpoints of a directory, oldest first; an error that says
    why when there are not that many."""
    if n < 1:
        raise CheckpointError(f"the number of checkpoints must be >= 1, got {n}")
    found = list_checkpoints(directory)
    if not found:
        raise CheckpointError(f"{directory}: no checkpoint (has this experiment been trained?)")
    if len(found) < n:
        raise CheckpointError(
            f"{directory}: {len(found)} checkpoint(s), cannot average the last {n} "
            "(train.keep_checkpoints limits how many are kept)"
        )
    return found[-n:]


def best_checkpoints(directory: str | os.PathLike, n: int) -> list[Path]:
    """The `n` complete checkpoints with the lowest dev WER (`TrainState.dev_wer`), oldest
    first (a tie goes to the newer one); an error that says why when there are not that
    many with a dev WER."""
    if n < 1:
        raise CheckpointError(f"the number of checkpoints must be >= 1, got {n}")
    found = list_checkpoints(directory)
    if not found:
        raise CheckpointError(f"{directory}: no checkpoint (has this experiment been trained?)")
    ranked = _ranked_by_dev_wer(found)
    if len(ranked) < n:
        raise CheckpointError(
            f"{directory}: {len(ranked)} checkpoint(s) with a dev WER, cannot average the best "
            f"{n} (a dev WER is measured at the end of each epoch when data.dev_shards is set; "
            "train.keep_best keeps the best ones)"
        )
    chosen = set(ranked[:n])
    return [p for p in found if p in chosen]


def _ranked_by_dev_wer(paths: list[Path]) -> list[Path]:
    """The checkpoints of `paths` that have a dev WER, best first (ties: newer first)."""
    scored = [(read_state(p).dev_wer, -i, p) for i, p in enumerate(paths)]
    return [p for wer, _, p in sorted(s for s in scored if s[0] is not None)]


def read_state(path: str | os.PathLike) -> TrainState:
    record = json.loads((Path(path) / "state.json").read_text())
    if record.get("schema") != SCHEMA_VERSION:
        raise CheckpointError(
            f"{path}: written by another asrkit (checkpoint schema {record.get('schema')}, this "
            f"one reads {SCHEMA_VERSION}); use that asrkit, or train anew"
        )
    return TrainState(**record)


# ------------------------------------------------------------------------------ writing
class CheckpointManager:
    """Writes `ckpt-<updates>` checkpoints into a directory and keeps the newest `keep`,
    and besides them the `keep_best` with the lowest dev WER."""

    def __init__(
        self, directory: str | os.PathLike, keep: int = 3, keep_best: int = 0,
        base: BaseRef | None = None,
    ):  # fmt: skip
        """`base`: write base-backed checkpoints (its weights left out)."""
        if keep < 1:
            raise ValueError(f"keep must be >= 1, got {keep}")
        self.directory = Path(directory)
        self.keep, self.keep_best, self.base = keep, keep_best, base
        self.directory.mkdir(parents=True, exist_ok=True)
        _recover(self.directory)

    def checkpoints(self) -> list[Path]:
        return list_checkpoints(self.directory)

    def latest(self) -> Path | None:
        found = self.checkpoints()
        return found[-1] if found else None

    def save(self, network, state: TrainState, optimizer=None, heads=None) -> Path:
        """Writes the checkpoint (the network's weights, the optimizer's state if given)
        completely, then puts it in place; older ones beyond `keep` are deleted only after
        that. A failed write raises `CheckpointError` and leaves every earlier checkpoint
        as it was."""
        final = self.directory / f"ckpt-{state.updates:08d}"
        _write_atomically(
            final, lambda tmp: _write(tmp, network, state, optimizer, heads, self.base, final)
        )
        found = self.checkpoints()
        best = set(_ranked_by_dev_wer(found)[: self.keep_best]) if self.keep_best else set()
        for old in found[: -self.keep]:
            if old not in best:
                shutil.rmtree(old, ignore_errors=True)
        return final


def _recover(directory: Path) -> None:
    """Puts back a checkpoint whose replacement was interrupted; removes killed writes."""
    for old in directory.glob("ckpt-*.old"):
        final = old.with_name(old.name[: -len(".old")])
        if final.exists():
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(old, final)
    for stale in directory.glob("ckpt-*.tmp"):
        shutil.rmtree(stale, ignore_errors=True)


def _write_atomically(final: Path, write) -> None:
    tmp = final.with_name(final.name + ".tmp")
    old = final.with_name(final.name + ".old")
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        write(tmp)
        _record_files(tmp)
    except (OSError, tf.errors.OpError) as err:
        shutil.rmtree(tmp, ignore_errors=True)
        reason = getattr(err, "strerror", None) or getattr(err, "message", None) or str(err)
        raise CheckpointError(
            f"{final}: could not write the checkpoint ({reason}); earlier checkpoints in "
            f"{final.parent} are intact. Free space or fix the directory, then rerun the same "
            "command to resume from the latest one."
        ) from err
    if final.exists():
        shutil.rmtree(old, ignore_errors=True)
        os.replace(final, old)
    os.replace(tmp, final)
    shutil.rmtree(old, ignore_errors=True)


def _record_files(directory: Path) -> None:
    """`files.json`: the size and SHA-256 of every other file of a written checkpoint."""
    record = {
        path.name: {"bytes": path.stat().st_size, "sha256": _sha256(path)}
        for path in sorted(directory.iterdir())
        if path.is_file() and path.name != FILES_RECORD
    }
    (directory / FILES_RECORD).write_text(json.dumps(record, indent=1) + "\n")


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(1 << 22):
            digest.update(block)
    return digest.hexdigest()


class DamagedCheckpoint(CheckpointError):
    """A checkpoint whose files are not what was written (truncated, emptied, altered)."""


def checkpoint_damage(path: str | os.PathLike) -> str | None:
    """What is wrong with a checkpoint directory's files, or None if they are as written:
    each file of `files.json` present, of its size and its SHA-256."""
    path = Path(path)
    try:
        record = json.loads((path / FILES_RECORD).read_text())
    except FileNotFoundError:
        return f"{path / FILES_RECORD}: missing (an incomplete copy?)"
    except (OSError, ValueError) as err:
        return f"{path / FILES_RECORD}: unreadable ({err})"
    for name, expected in record.items():
        file = path / name
        try:
            size = file.stat().st_size
        except FileNotFoundError:
            return f"{file}: missing"
        if size != expected["bytes"]:
            return f"{file}: {size:,} bytes, {expected['bytes']:,} were written (truncated?)"
        if _sha256(file) != expected["sha256"]:
            return f"{file}: its contents differ from what was written (checksum mismatch)"
    return None


def verify_checkpoint(path: str | os.PathLike) -> None:
    """Raises `DamagedCheckpoint` naming the damaged file and the newest intact checkpoint
    beside it, if any."""
    damage = checkpoint_damage(path)
    if damage is None:
        return
    path = Path(path)
    alternative = newest_intact(path.parent, exclude=path)
    hint = (
        f"the newest intact checkpoint is {alternative} (pass --checkpoint {alternative})"
        if alternative
        else "no intact checkpoint is beside it"
    )
    raise DamagedCheckpoint(f"damaged checkpoint: {damage}; {hint}")


def newest_intact(directory: str | os.PathLike, exclude: Path | None = None) -> Path | None:
    """The newest checkpoint of a directory whose files check out (None if there is none)."""
    for candidate in reversed(list_checkpoints(directory)):
        if candidate != exclude and checkpoint_damage(candidate) is None:
            return candidate
    return None


def set_aside(path: Path) -> Path:
    """Renames a damaged checkpoint out of the way (`ckpt-N.damaged`, never deleted)."""
    aside = path.with_name(path.name + ".damaged")
    n = 1
    while aside.exists():
        n += 1
        aside = path.with_name(f"{path.name}.damaged{n}")
    os.replace(path, aside)
    return aside


def named_parts(network, heads=None) -> dict[str, keras.Variable]:
    """The network's variables by name and, for training, its loss heads' under
    `HEADS_PREFIX`."""
    named = named_variables(network)
    if heads is not None:
        named.update({HEADS_PREFIX + k: v for k, v in named_variables(heads).items()})
    return named


def _write(
    directory: Path, network, state: TrainState, optimizer, heads=None,
    base: BaseRef | None = None, final: Path | None = None,
) -> None:  # fmt: skip
    named = named_parts(network, heads)
    # The Keras variables themselves, not their `.value`: the optimizer tracks the same
    # objects, so each weight is written once (a `.value` is another object to TensorFlow,
    # which then writes every weight a second time under the optimizer).
    weights = _own(named, base)
    if base is not None:
        base.write(directory, final or directory)
    checkpoint = (
        tf.train.Checkpoint(weights=weights)
        if optimizer is None
        else tf.train.Checkpoint(weights=weights, optimizer=optimizer)
    )
    checkpoint.write(str(directory / "ckpt"))
    order = _trainable_order(network, named, heads)
    (directory / "variables.json").write_text(json.dumps(order, indent=0) + "\n")
    (directory / "state.json").write_text(json.dumps(asdict(state)) + "\n")  # last: complete


def _own(named: dict, base: BaseRef | None) -> dict:
    """What a checkpoint holds itself: all but its base's weights."""
    return dict(named) if base is None else {k: v for k, v in named.items() if k not in base.names}


def _trainable_order(network, named: dict[str, keras.Variable], heads=None) -> list[str]:
    """Trainable variable names in the order the optimizer's slots follow (the task's:
    the network's, then its loss heads')."""
    by_id = {id(v): k for k, v in named.items()}
    trainable = [*network.trainable_variables, *(heads.trainable_variables if heads else [])]
    return [by_id[id(v)] for v in trainable]


def write_weights(
    directory: str | os.PathLike, values: dict[str, np.ndarray], state: TrainState,
    base: BaseRef | None = None,
) -> Path:  # fmt: skip
    """A weights-only checkpoint (no optimizer) from named values that `restore(...,
    with_optimizer=False)`, `asrkit decode --checkpoint` and `--init-from` read; base-backed
    (`base`'s weights left out) if given."""
    final = Path(directory)
    final.parent.mkdir(parents=True, exist_ok=True)

    def write(tmp: Path) -> None:
        if base is not None:
            base.write(tmp, final)
        weights = {k: tf.Variable(v, trainable=False) for k, v in _own(values, base).items()}
        tf.train.Checkpoint(weights=weights).write(str(tmp / "ckpt"))
        (tmp / "state.json").write_text(json.dumps(asdict(state)) + "\n")

    _write_atomically(final, write)
    return final


# ------------------------------------------------------------------------------ reading
def read_weights(path: str | os.PathLike, verified: bool = False) -> dict[str, np.ndarray]:
    """The named model weights of a checkpoint directory (no model needed). `verified`:
    the caller has just checked its files (`checkpoint_damage`); they are not hashed again."""
    reader = _reader(path, verified)
    out = {}
    for key in reader.get_variable_to_shape_map():
        match = _WEIGHT_KEY.match(key)
        if match:
            out[_unescape(match.group(1))] = reader.get_tensor(key)
    if (Path(path) / BASE_RECORD).is_file():
        out.update(_base_weights(Path(path)))
    return out


def _reader(path: str | os.PathLike, verified: bool = False):
    path = Path(path)
    if not path.is_dir():
        raise CheckpointError(f"{path}: no such checkpoint directory")
    if not (path / "ckpt.index").exists():
        raise CheckpointError(f"{path}: not a checkpoint directory (no ckpt.index)")
    if not verified:
        verify_checkpoint(path)
    try:
        reader = tf.train.load_checkpoint(str(path / "ckpt"))
    except (tf.errors.OpError, ValueError) as err:  # written whole, then damaged in place
        message = getattr(err, "message", None) or str(err)
        raise DamagedCheckpoint(f"{path}: TensorFlow cannot read it ({message})") from None
    return reader


def restore(
    network, path: str | os.PathLike, optimizer=None, heads=None, verified: bool = False
) -> TrainState:
    """Loads a checkpoint directory into a built network (and an optimizer, to resume).

    The checkpoint must hold exactly the network's variables, with their shapes. With an
    optimizer, the trainable variables must also be in the order the checkpoint's optimizer
    slots were saved in; otherwise `CheckpointError` says to fine-tune instead.
    """
    path = Path(path)
    saved = read_weights(path, verified)
    if heads is None:  # inference: a training task's loss heads are not the network's
        saved = network_weights(saved)
    named = named_parts(network, heads)
    missing = sorted(set(named) - set(saved))
    # Variables the model lacks: another architecture whose variables happen to include
    # all of this one's (fewer blocks, no per-block norms) would otherwise load silently.
    extra = sorted(set(saved) - set(named))
    wrong = [
        f"{k} {tuple(saved[k].shape)} != {tuple(v.shape)}"
        for k, v in named.items()
        if k in saved and tuple(saved[k].shape) != tuple(v.shape)
    ]
    if missing or extra or wrong:
        raise CheckpointError(
            f"{path}: does not fit this model ({len(missing)} variable(s) missing, e.g. "
            f"{missing[:3]}; {len(extra)} the model does not have, e.g. {extra[:3]}; shape "
            f"differences: {wrong[:3]}). Is it another architecture? Use --init-from to load "
            "what fits."
        )
    if optimizer is not None:
        order_file = path / "variables.json"
        order = json.loads(order_file.read_text()) if order_file.exists() else None
        if order != _trainable_order(network, named, heads):
            raise CheckpointError(
                f"{path}: the model's trainable variables differ from (or are ordered "
                "differently than) when this checkpoint was written, so its optimizer state "
                "cannot be matched. Start a new experiment with --init-from to keep the weights "
                "with a fresh optimizer."
            )
        base = checkpoint_base(path)
        status = tf.train.Checkpoint(weights=_own(named, base), optimizer=optimizer).read(
            str(path / "ckpt")
        )
        status.assert_existing_objects_matched()
        for key in base.names if base else ():
            named[key].assign(saved[key])
    else:
        for key, var in named.items():
            var.assign(saved[key])
    return read_state(path)


def network_weights(values: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Named weights without a training task's loss heads."""
    return {k: v for k, v in values.items() if not k.startswith(HEADS_PREFIX)}


def average_checkpoints(paths: list[str | os.PathLike], prepare=None) -> dict[str, np.ndarray]:
    """The named model weights of several checkpoints, averaged.

    Floating-point variables are summed in float64 and cast back to their stored dtype;
    integer ones (dropout RNG states, counters) are taken from the last checkpoint.
    `prepare`: applied to each checkpoint's values first (e.g. LoRA merged into the
    kernels: the average of the networks, not of their factors).
    """
    if not paths:
        raise ValueError("average_checkpoints: no checkpoints given")
    every = [(prepare or dict)(read_weights(p)) for p in paths]
    last = every[-1]
    for path, weights in zip(paths, every, strict=True):
        if weights.keys() != last.keys():
            raise ValueError(f"{path}: its variables differ from {paths[-1]}'s (another model?)")
    averaged = {}
    for key, value in last.items():
        if not np.issubdtype(value.dtype, np.floating):
            averaged[key] = value
            continue
        total = np.zeros(value.shape, np.float64)
        for path, weights in zip(paths, every, strict=True):
            if weights[key].shape != value.shape:
                raise ValueError(f"{path}: {key} has shape {weights[key].shape} != {value.shape}")
            total += weights[key].astype(np.float64)
        averaged[key] = (total / len(every)).astype(value.dtype)
    return averaged


def assign_weights(model, values: dict[str, np.ndarray]) -> None:
    """Loads named values (e.g. `average_checkpoints`) into a built model; all must fit
    (loss heads, which only training has, are left out)."""
    values = network_weights(values)
    named = named_variables(model)
    if named.keys() != values.keys():
        missing, extra = sorted(named.keys() - values.keys()), sorted(values.keys() - named.keys())
        raise CheckpointError(f"weights do not fit the model: missing {missing}, unknown {extra}")
    for key, var in named.items():
        if tuple(var.shape) != values[key].shape:
            raise CheckpointError(f"{key}: shape {tuple(var.shape)} != {values[key].shape}")
        var.assign(values[key])


@dataclass(frozen=True)
class AveragedCheckpoint:
    path: Path
    sources: list[Path]


def average_last(
    exp_dir: str | os.PathLike, last: int, out: str | os.PathLike | None = None, prepare=None
) -> AveragedCheckpoint:
    """Averages an experiment's last `last` checkpoints into `out` (default
    `<exp_dir>/averaged/last<N>-<final checkpoint>`); `prepare` as `average_checkpoints`."""
    sources = last_checkpoints(Path(exp_dir) / "checkpoints", last)
    return _average_into(exp_dir, sources, out, f"last{last}", prepare)


def average_best(
    exp_dir: str | os.PathLike, best: int, out: str | os.PathLike | None = None, prepare=None
) -> AveragedCheckpoint:
    """Averages an experiment's `best` checkpoints by dev WER into `out` (default
    `<exp_dir>/averaged/best<N>-<newest of them>`); `prepare` as `average_checkpoints`."""
    sources = best_checkpoints(Path(exp_dir) / "checkpoints", best)
    return _average_into(exp_dir, sources, out, f"best{best}", prepare)


def _average_into(exp_dir, sources: list[Path], out, label: str, prepare) -> AveragedCheckpoint:
    exp_dir = Path(exp_dir)
    out = Path(out) if out else exp_dir / "averaged" / f"{label}-{sources[-1].name}"
    # Checkpoints of one base average into one of that base (the base's weights are the
    # same in each); a `prepare` (LoRA merged) makes every kernel the average's own.
    bases = {checkpoint_base(p) for p in sources}
    base = bases.pop() if len(bases) == 1 and prepare is None else None
    write_weights(out, average_checkpoints(sources, prepare), read_state(sources[-1]), base)
    (out / "averaged.json").write_text(json.dumps([str(p) for p in sources], indent=1) + "\n")
    return AveragedCheckpoint(out, sources)


@dataclass(frozen=True)
class LoadReport:
    loaded: list[str]  # names copied from the checkpoint
    skipped: list[tuple[str, str]]  # (name, why): in both, but the shape differs
    fresh: list[str]  # in the model, not in the checkpoint: keep their initialisation
    unused: list[str]  # in the checkpoint, not in the model


def load_matching_weights(model, path: str | os.PathLike) -> LoadReport:
    """Fine-tuning: copies every model variable whose name and shape match the checkpoint's.

    What differs in shape — the predictor embedding and the joint output layer when the
    tokenizer changes — keeps its fresh initialisation; everything is reported by name.
    """
    saved = network_weights(read_weights(path))  # heads: the new task's loss builds its own
    loaded, skipped, fresh = [], [], []
    for key, var in named_variables(model).items():
        if key not in saved:
            fresh.append(key)
        elif tuple(saved[key].shape) != tuple(var.shape):
            skipped.append((key, f"shape {tuple(saved[key].shape)} != {tuple(var.shape)}"))
        else:
            var.assign(saved[key])
            loaded.append(key)
    unused = sorted(set(saved) - set(loaded) - {k for k, _ in skipped})
    return LoadReport(loaded, skipped, fresh, unused)
