"""NeMo's tarred audio datasets, read as they are.

A NeMo tarred dataset is `tarred_audio_filepaths` (tar files of audio files, usually a brace
pattern such as `audio_{0..511}.tar`, or NeMo's `audio__OP_0..511_CL_.tar`) and either one
manifest per tar (`sharded_manifests/manifest_{0..511}.json`, the same pattern) or one
manifest for all whose entries name their tar by `shard_id`. An entry's `audio_filepath` is
a member of its tar; NeMo's converter writes a second entry for a file already in that tar
as `name-subN.ext`, and an entry with an `offset` is a segment of its member.

`read_tarred` checks the correspondence before any audio is read: an entry whose member is
not in its tar and a member no entry names are both listed (the first skipped, or refused
by the caller); the utterances it returns read their audio from the tar by byte offset
(`asrkit.data.manifest.read_utterance`), each tar's headers read once per process.
"""

from __future__ import annotations

import itertools
import re
import tarfile
import threading
from dataclasses import dataclass, field
from pathlib import Path

from asrkit.data.manifest import (
    ManifestError,
    Utterance,
    manifest_record,
    parse_manifest_record,
)

_BRACES = re.compile(r"\{([^{}]*)\}")
_SUB = re.compile(r"^(?P<base>.*)-sub\d+(?P<ext>\.[^.]+)$")


def expand_braces(pattern: str) -> list[str]:
    """`a_{0..2}.tar` -> a_0.tar, a_1.tar, a_2.tar; `{x,y}` -> x, y; ranges keep a zero
    padding (`{00..10}`); NeMo's `_OP_`/`_CL_` stand for the braces; several braces give
    their product in order."""
    pattern = pattern.replace("_OP_", "{").replace("_CL_", "}")
    parts = _BRACES.split(pattern)  # text, group, text, group, ..., text
    choices = []
    for i, part in enumerate(parts):
        if i % 2 == 0:
            choices.append([part])
            continue
        if ".." in part:
            low, _, high = part.partition("..")
            if not (low.isdigit() and high.isdigit()):
                raise ManifestError(f"{pattern}: {{{part}}}: a range needs numbers like 0..511")
            width = len(low) if low.startswith("0") and len(low) > 1 else 0
            step = 1 if int(high) >= int(low) else -1
            choices.append([str(n).zfill(width) for n in range(int(low), int(high) + step, step)])
        else:
            choices.append(part.split(","))
    return ["".join(combination) for combination in itertools.product(*choices)]


@dataclass(frozen=True)
class TarredSet:
    """The utterances of a tarred dataset, and what does not correspond."""

    utterances: list[Utterance]
    missing: list[str] = field(default_factory=list)  # entries whose member is not there
    extra: list[str] = field(default_factory=list)  # members no entry names


def read_tarred(manifests: str, tars: str) -> TarredSet:
    """The entries of `manifests` (a path or brace pattern) with their audio in `tars`."""
    tar_paths = expand_braces(tars)
    manifest_paths = expand_braces(manifests)
    for path in [*tar_paths, *manifest_paths]:
        if not Path(path).is_file():
            source = tars if path in tar_paths else manifests
            raise ManifestError(f"{path}: no such file (from {source})")
    if len(manifest_paths) not in (1, len(tar_paths)):
        raise ManifestError(
            f"{len(manifest_paths)} manifests for {len(tar_paths)} tar files: give one manifest "
            "per tar, in the same order, or one whose entries carry shard_id"
        )
    members = [_index(path) for path in tar_paths]
    used: list[set[str]] = [set() for _ in tar_paths]
    utterances, missing = [], []
    for number, manifest in enumerate(manifest_paths):
        for line_number, line in _lines(manifest):
            where = f"{manifest}:{line_number}"
            entry = manifest_record(line, Path(manifest), line_number)
            shard = number if len(manifest_paths) > 1 else _shard_id(entry, where, len(tar_paths))
            utterance = parse_manifest_record(entry, Path(manifest), line_number)
            name = str(entry["audio_filepath"])
            member = _member(name, members[shard])
            if member is None:
                missing.append(f"{where}: {name} is not in {tar_paths[shard]}")
                continue
            used[shard].add(member)
            utterances.append(Utterance(
                utterance.id, tar_paths[shard], utterance.duration, utterance.text,
                utterance.speaker, utterance.offset, member,
            ))  # fmt: skip
    extra = [
        f"{tar_paths[i]}: {name} (no entry names it)"
        for i, index in enumerate(members)
        for name in index
        if name not in used[i]
    ]
    return TarredSet(utterances, missing, extra)


def read_member(tar_path: str, member: str) -> bytes:
    """A member's bytes, read by its offset in the tar."""
    offset, size = _index(tar_path)[member]
    with open(tar_path, "rb") as f:
        f.seek(offset)
        data = f.read(size)
    if len(data) != size:
        raise OSError(f"{tar_path}: {member} is truncated ({len(data)} of {size} bytes)")
    return data


_INDICES: dict[str, dict[str, tuple[int, int]]] = {}
_LOCK = threading.Lock()


def _index(tar_path: str) -> dict[str, tuple[int, int]]:
    """Each regular member's data offset and size (the headers only are read)."""
    with _LOCK:
        if tar_path not in _INDICES:
            try:
                with tarfile.open(tar_path, mode="r:") as tar:
                    _INDICES[tar_path] = {m.name: (m.offset_data, m.size)
                                          for m in tar.getmembers() if m.isfile()}  # fmt: skip
            except (tarfile.TarError, OSError) as err:
                raise ManifestError(f"{tar_path}: not a readable tar file ({err})") from None
        return _INDICES[tar_path]


def _member(name: str, index: dict) -> str | None:
    if name in index:
        return name
    sub = _SUB.match(name)  # the converter's name for a second entry of one file
    if sub and sub["base"] + sub["ext"] in index:
        return sub["base"] + sub["ext"]
    return None


def _shard_id(entry: dict, where: str, shards: int) -> int:
    shard = entry.get("shard_id")
    if not isinstance(shard, int) or isinstance(shard, bool) or not 0 <= shard < shards:
        raise ManifestError(
            f"{where}: shard_id {shard!r} names none of the {shards} tar file(s) given: one "
            "manifest for several tars needs each entry's shard_id, counted in the tar "
            "pattern's order from 0"
        )
    return shard


def _lines(path: str):
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, start=1):
            if line.strip():
                yield number, line
