"""PyTorch checkpoints (`torch.save`'s zip format) read into NumPy, without torch and
without running the pickle's code.

A `torch.save` file is a zip archive: `<name>/data.pkl`, a pickle of the saved object
whose tensors are persistent references to raw storages `<name>/data/<key>`, and a few
small records (`byteorder`, `version`). The pickle is read by `_SafeUnpickler`, which
resolves only the globals a state dict of tensors needs (`ALLOWED`) — a storage type, the
tensor and parameter rebuild functions, `OrderedDict` — to stand-ins of its own; any other
global (`os.system`, `builtins.eval`, a class of NeMo's) is refused by name before
anything of it could run. Tensors become NumPy arrays (bfloat16 widened to float32).
"""

from __future__ import annotations

import collections
import io
import os
import pickle
import zipfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from asrkit.errors import InputError

# torch's storage classes -> the NumPy dtype of their elements.
_STORAGE_DTYPES = {
    "FloatStorage": np.float32,
    "DoubleStorage": np.float64,
    "HalfStorage": np.float16,
    "BFloat16Storage": "bfloat16",
    "LongStorage": np.int64,
    "IntStorage": np.int32,
    "ShortStorage": np.int16,
    "CharStorage": np.int8,
    "ByteStorage": np.uint8,
    "BoolStorage": np.bool_,
}
_REBUILDS = ("_rebuild_tensor_v2", "_rebuild_parameter")
# Every global a checkpoint of tensors may name; nothing else is ever resolved.
ALLOWED = frozenset(
    {("collections", "OrderedDict")}
    | {("torch._utils", name) for name in _REBUILDS}
    | {("torch", name) for name in _STORAGE_DTYPES}
)


class CheckpointFormatError(InputError):
    """A file that is not a PyTorch checkpoint of tensors, or one that names code."""


@dataclass(frozen=True)
class _StorageType:
    name: str


@dataclass(frozen=True)
class _Storage:
    dtype: object  # a NumPy dtype, or "bfloat16"
    key: str
    count: int


def read_torch_checkpoint(path: str | os.PathLike) -> dict[str, np.ndarray]:
    """The tensors of a `torch.save`d state dict, by key (nested dicts flattened with
    '.'); `CheckpointFormatError` naming the file for anything else."""
    path = Path(path)
    try:
        archive = zipfile.ZipFile(path)
    except (zipfile.BadZipFile, OSError) as err:
        raise CheckpointFormatError(f"{path}: not a PyTorch checkpoint ({err})") from None
    with archive:
        return _read(archive, path)


def read_torch_checkpoint_bytes(data: bytes, name: str) -> dict[str, np.ndarray]:
    """The same for a checkpoint held in memory (`name` is used in messages)."""
    try:
        archive = zipfile.ZipFile(io.BytesIO(data))
    except zipfile.BadZipFile as err:
        raise CheckpointFormatError(f"{name}: not a PyTorch checkpoint ({err})") from None
    with archive:
        return _read(archive, Path(name))


def read_torch_checkpoint_file(file, name: str) -> dict[str, np.ndarray]:
    """The same from a seekable binary file object (a member of a plain tar, read in place:
    one tensor's bytes at a time)."""
    try:
        archive = zipfile.ZipFile(file)
    except (zipfile.BadZipFile, OSError, EOFError) as err:
        raise CheckpointFormatError(f"{name}: not a PyTorch checkpoint ({err})") from None
    with archive:
        return _read(archive, Path(name))


def _read(archive: zipfile.ZipFile, path: Path) -> dict[str, np.ndarray]:
    names = archive.namelist()
    pickles = [n for n in names if n.endswith("/data.pkl") and n.count("/") == 1]
    if len(pickles) != 1:
        raise CheckpointFormatError(f"{path}: no single <name>/data.pkl (not torch.save's format)")
    root = pickles[0][: -len("data.pkl")]
    byteorder = (
        archive.read(root + "byteorder").decode().strip()
        if root + "byteorder" in names
        else "little"
    )
    if byteorder != "little":
        raise CheckpointFormatError(f"{path}: byte order {byteorder!r} is not supported")
    try:
        loaded = _SafeUnpickler(io.BytesIO(archive.read(pickles[0])), path).load()
        tensors = _tensors(loaded, "", archive, root, path)
    except (zipfile.BadZipFile, KeyError, EOFError, pickle.UnpicklingError, ValueError,
            TypeError) as err:  # fmt: skip
        if isinstance(err, CheckpointFormatError):
            raise
        raise CheckpointFormatError(f"{path}: damaged checkpoint ({err})") from None
    return tensors


class _SafeUnpickler(pickle.Unpickler):
    def __init__(self, file, path: Path):
        super().__init__(file)
        self.path = path

    def find_class(self, module, name):
        if (module, name) not in ALLOWED:
            raise CheckpointFormatError(
                f"{self.path}: the checkpoint names the global {module}.{name}, which a "
                "checkpoint of tensors does not need; refused without running it"
            )
        if module == "collections":
            return collections.OrderedDict
        if module == "torch":
            return _StorageType(name)
        return _Rebuild(name)

    def persistent_load(self, pid):
        if not (isinstance(pid, tuple) and len(pid) == 5 and pid[0] == "storage"):
            raise CheckpointFormatError(f"{self.path}: unknown persistent reference {pid!r:.80}")
        _, kind, key, _location, count = pid
        if not isinstance(kind, _StorageType):
            raise CheckpointFormatError(f"{self.path}: a storage of unknown type {kind!r:.80}")
        return _Storage(_STORAGE_DTYPES[kind.name], str(key), int(count))


@dataclass(frozen=True)
class _Tensor:
    storage: _Storage
    offset: int
    size: tuple
    stride: tuple


class _Rebuild:
    """Stands in for torch's rebuild functions: records what the tensor is."""

    def __init__(self, name: str):
        self.name = name

    def __call__(self, *args):
        if self.name == "_rebuild_parameter":  # (tensor, requires_grad, backward_hooks)
            return args[0]
        storage, offset, size, stride = args[:4]
        if not isinstance(storage, _Storage):
            raise CheckpointFormatError("a tensor without a storage")
        return _Tensor(storage, int(offset), tuple(size), tuple(stride))


def _tensors(obj, prefix: str, archive, root: str, path: Path) -> dict[str, np.ndarray]:
    out: dict[str, np.ndarray] = {}
    if isinstance(obj, _Tensor):
        out[prefix] = _materialise(obj, archive, root, path, prefix)
    elif isinstance(obj, dict):
        for key, value in obj.items():
            out.update(_tensors(value, f"{prefix}.{key}" if prefix else str(key), archive,
                                root, path))  # fmt: skip
    # Anything else (numbers, strings, None: training metadata) carries no weights.
    return out


def _materialise(tensor: _Tensor, archive, root: str, path: Path, key: str) -> np.ndarray:
    storage = tensor.storage
    raw = archive.read(f"{root}data/{storage.key}")
    bfloat16 = storage.dtype == "bfloat16"
    dtype = np.dtype(np.uint16 if bfloat16 else storage.dtype)
    if len(raw) < storage.count * dtype.itemsize:
        raise CheckpointFormatError(
            f"{path}: tensor {key}: its storage holds {len(raw)} bytes, "
            f"{storage.count * dtype.itemsize} expected (truncated?)"
        )
    flat = np.frombuffer(raw, dtype, count=storage.count)
    if tensor.size:
        last = tensor.offset + sum((n - 1) * s for n, s in zip(tensor.size, tensor.stride,
                                                                strict=True))  # fmt: skip
        if min(tensor.size) > 0 and last >= storage.count:
            raise CheckpointFormatError(f"{path}: tensor {key} reaches past its storage")
    view = np.lib.stride_tricks.as_strided(
        flat[tensor.offset :], shape=tensor.size,
        strides=tuple(s * dtype.itemsize for s in tensor.stride),
    )  # fmt: skip
    array = np.array(view)  # a copy: independent of the archive's bytes
    if bfloat16:
        array = (array.astype(np.uint32) << 16).view(np.float32)
    return array
