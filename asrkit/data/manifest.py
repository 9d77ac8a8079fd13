"""The utterance data model and its JSONL manifests.

One `Utterance` per line; time is always in seconds. Reading validates every line at the
boundary and names the file, line and key of anything wrong. Writing is atomic (temp file
+ rename), so an interrupted run never leaves a half-written manifest behind.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

from asrkit.errors import UserError


@dataclass(frozen=True)
class Utterance:
    id: str
    audio_path: str
    duration: float  # seconds
    text: str
    speaker: str


_FIELDS = {"id": str, "audio_path": str, "duration": (int, float), "text": str, "speaker": str}


class ManifestError(UserError, ValueError):
    """A manifest line that does not describe a valid utterance."""


def write_manifest(path: str | os.PathLike, utterances: Iterable[Utterance]) -> int:
    """Writes one JSON object per line, atomically. Returns the number written."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    count = 0
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            for utt in utterances:
                f.write(json.dumps(asdict(utt), ensure_ascii=False) + "\n")
                count += 1
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return count


def iter_manifest(path: str | os.PathLike) -> Iterator[Utterance]:
    path = Path(path)
    with path.open(encoding="utf-8") as f:
        for number, line in enumerate(f, start=1):
            if line.strip():
                yield _parse_line(line, path, number)


def read_manifest(path: str | os.PathLike) -> list[Utterance]:
    return list(iter_manifest(path))


def read_usable_manifest(path: str | os.PathLike, option: str = "--manifest") -> list[Utterance]:
    """A manifest that a command is about to work through: missing, empty, or naming audio
    that is not there is an error naming the manifest (and its line), before any work."""
    path = Path(path)
    if not path.is_file():
        raise ManifestError(f"{option} {path}: no such manifest")
    utterances, numbers = [], []
    with path.open(encoding="utf-8") as f:
        for number, line in enumerate(f, start=1):
            if line.strip():
                utterances.append(_parse_line(line, path, number))
                numbers.append(number)
    if not utterances:
        raise ManifestError(f"{option} {path}: the manifest holds no utterances")
    for utterance, number in zip(utterances, numbers, strict=True):
        if not Path(utterance.audio_path).is_file():
            raise ManifestError(
                f"{path}:{number}: utterance {utterance.id}: audio {utterance.audio_path}: no "
                "such file (audio paths are as written, or relative to the directory you run in)"
            )
    return utterances


def _parse_line(line: str, path: Path, number: int) -> Utterance:
    where = f"{path}:{number}"
    try:
        record = json.loads(line)
    except json.JSONDecodeError as err:
        raise ManifestError(f"{where}: not valid JSON ({err.msg})") from None
    if not isinstance(record, dict):
        raise ManifestError(f"{where}: expected a JSON object")
    unknown = sorted(set(record) - set(_FIELDS))
    if unknown:
        raise ManifestError(f"{where}: unknown key(s) {unknown}")
    for key, kind in _FIELDS.items():
        if key not in record:
            raise ManifestError(f"{where}: missing key {key!r}")
        if not isinstance(record[key], kind) or isinstance(record[key], bool):
            raise ManifestError(f"{where}: key {key!r} has the wrong type")
    if not record["duration"] > 0:
        raise ManifestError(f"{where}: utterance {record['id']}: duration must be > 0")
    return Utterance(**{**record, "duration": float(record["duration"])})
