"""A NeMo `.nemo` file read safely: its members by name, into memory, never extracted.

A `.nemo` file is a tar archive (gzip-compressed or not) holding `model_config.yaml`,
`model_weights.ckpt` (a PyTorch checkpoint, read by `asrkit.importers.torch_checkpoint`)
and the files the config names as `nemo:<member>` (the SentencePiece model, vocabularies).
From a plain tar (what NeMo writes) the checkpoint is read in place, one tensor at a time;
from a compressed one it is read whole first.
Only regular members with plain relative names are accepted: an absolute name, a `..`
part, a link or a device anywhere in the archive refuses it whole, naming the member.
"""

from __future__ import annotations

import os
import tarfile
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

import numpy as np
import yaml

from asrkit.config import yaml_problem
from asrkit.errors import InputError
from asrkit.importers.torch_checkpoint import (
    read_torch_checkpoint_bytes,
    read_torch_checkpoint_file,
)

CONFIG_MEMBER = "model_config.yaml"
WEIGHTS_MEMBER = "model_weights.ckpt"


class NemoArchiveError(InputError):
    """A .nemo file that is damaged, incomplete or unsafe; the message names the member."""


@dataclass(frozen=True)
class NemoArchive:
    path: Path
    config: dict  # model_config.yaml
    weights: dict[str, np.ndarray]  # model_weights.ckpt's state dict
    members: dict[str, bytes]  # every other member, by its plain name

    def member(self, reference: str) -> bytes:
        """A member the config names (`nemo:abc_tokenizer.model` or a bare name)."""
        name = reference.removeprefix("nemo:")
        name = str(PurePosixPath(name))
        if name not in self.members:
            raise NemoArchiveError(f"{self.path}: the config names {reference}, not in the archive")
        return self.members[name]


def read_nemo(path: str | os.PathLike) -> NemoArchive:
    path = Path(path)
    if not path.is_file():
        raise NemoArchiveError(f"{path}: no such .nemo file")
    try:
        with tarfile.open(path, "r:*") as archive:
            members, weights = _read_members(archive, path, _uncompressed(path))
    except tarfile.ReadError:
        raise NemoArchiveError(
            f"{path}: not a .nemo archive (a .nemo file is a tar archive; this is none, or a "
            "damaged one)"
        ) from None
    except (tarfile.TarError, EOFError, OSError) as err:
        reason = " ".join(str(err).split())
        raise NemoArchiveError(f"{path}: not a readable .nemo archive ({reason})") from None
    for required, present in ((CONFIG_MEMBER, CONFIG_MEMBER in members),
                              (WEIGHTS_MEMBER, weights is not None)):  # fmt: skip
        if not present:
            raise NemoArchiveError(f"{path}: no {required} in the archive (not a NeMo model?)")
    try:
        config = yaml.safe_load(members.pop(CONFIG_MEMBER).decode("utf-8"))
    except yaml.YAMLError as err:
        raise NemoArchiveError(f"{path}: {CONFIG_MEMBER}: {yaml_problem(err)}") from None
    except UnicodeDecodeError as err:
        raise NemoArchiveError(f"{path}: {CONFIG_MEMBER} is not UTF-8 text ({err})") from None
    if not isinstance(config, dict):
        raise NemoArchiveError(f"{path}: {CONFIG_MEMBER} is not a mapping")
    return NemoArchive(path, config, weights, members)


def _uncompressed(path: Path) -> bool:
    """A plain tar (NeMo's `save_to` writes one): its members can be read in place."""
    with open(path, "rb") as file:
        magic = file.read(6)
    return not magic.startswith((b"\x1f\x8b", b"BZh", b"\xfd7zXZ"))


def _read_members(
    archive: tarfile.TarFile, path: Path, in_place: bool
) -> tuple[dict[str, bytes], dict | None]:
    """The members' bytes, and the weights' tensors (None if absent): from a plain tar read
    tensor by tensor in place (a 0.6 B model's 2.4 GB checkpoint is never held as bytes
    beside its tensors), from a compressed one read whole first."""
    members: dict[str, bytes] = {}
    weights = None
    for info in archive.getmembers():
        name = PurePosixPath(info.name)
        if info.isdir() and not name.is_absolute() and ".." not in name.parts:
            continue
        if name.is_absolute() or ".." in name.parts or not info.isfile():
            kind = "link" if (info.issym() or info.islnk()) else "unsafe name or type"
            raise NemoArchiveError(
                f"{path}: member {info.name!r} ({kind}) refused: a .nemo archive holds plain "
                "files only"
            )
        data = archive.extractfile(info)
        if data is None:
            raise NemoArchiveError(f"{path}: member {info.name!r} cannot be read")
        if in_place and str(name) == WEIGHTS_MEMBER:
            weights = read_torch_checkpoint_file(data, f"{path}:{WEIGHTS_MEMBER}")
            continue
        body = data.read()
        if len(body) != info.size:
            raise NemoArchiveError(f"{path}: member {info.name!r} is truncated")
        if str(name) == WEIGHTS_MEMBER:
            weights = read_torch_checkpoint_bytes(body, f"{path}:{WEIGHTS_MEMBER}")
            continue
        members[str(name)] = body
    return members, weights
