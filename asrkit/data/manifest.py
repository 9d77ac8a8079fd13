"""The utterance data model and its JSONL manifests.

One `Utterance` per line; time is always in seconds. Reading validates every line at the
boundary and names the file, line and key of anything wrong. Writing is atomic (temp file
+ rename), so an interrupted run never leaves a half-written manifest behind.

Two line formats are read, line by line: asrkit's (`id`, `audio_path`, `duration`, `text`,
`speaker`, optional `offset`) and NeMo's (`audio_filepath`, `duration`, `text`, optional
`offset` for a segment of a longer recording, `speaker` or `speaker_id`, `lang` and any
other key NeMo's datasets carry). A NeMo entry's id is its file's stem (with the segment's
offset), its speaker "unknown" if none is given, and a relative `audio_filepath` is taken
from the manifest's directory when the file is there, as NeMo resolves it.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

from asrkit.audio import AudioError, read_audio
from asrkit.errors import UserError


@dataclass(frozen=True)
class Utterance:
    id: str
    audio_path: str
    duration: float  # seconds
    text: str
    speaker: str
    offset: float | None = None  # seconds into audio_path: a segment of `duration` seconds
    member: str | None = None  # audio_path is a tar file, the audio this member of it


_FIELDS = {"id": str, "audio_path": str, "duration": (int, float), "text": str, "speaker": str}
_NEMO_FIELDS = {"audio_filepath": str, "duration": (int, float), "text": str}


class ManifestError(UserError, ValueError):
    """A manifest line that does not describe a valid utterance."""


def read_utterance(utterance: Utterance, sample_rate: int):
    """An utterance's samples: its whole file (or tar member), or the segment its `offset`
    and `duration` mark (read from the file without copying it)."""
    data, name = None, utterance.audio_path
    if utterance.member is not None:
        from asrkit.data.nemo_tarred import read_member

        name = f"{utterance.audio_path}:{utterance.member}"
        try:
            data = read_member(utterance.audio_path, utterance.member)
        except OSError as err:
            raise AudioError(f"{name}: cannot read the member ({err})") from None
    if utterance.offset is None:
        return read_audio(name, sample_rate, data=data)
    return read_audio(name, sample_rate, utterance.offset, utterance.duration, data=data)


def write_manifest(path: str | os.PathLike, utterances: Iterable[Utterance]) -> int:
    """Writes one JSON object per line, atomically. Returns the number written."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    count = 0
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            for utt in utterances:
                record = asdict(utt)
                for optional in ("offset", "member"):
                    if record[optional] is None:
                        del record[optional]
                f.write(json.dumps(record, ensure_ascii=False) + "\n")
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
                yield parse_manifest_line(line, path, number)


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
                utterances.append(parse_manifest_line(line, path, number))
                numbers.append(number)
    if not utterances:
        raise ManifestError(f"{option} {path}: the manifest holds no utterances")
    for utterance, number in zip(utterances, numbers, strict=True):
        if not Path(utterance.audio_path).is_file():
            raise ManifestError(
                f"{path}:{number}: utterance {utterance.id}: audio {utterance.audio_path}: no "
                "such file (a relative path is read from the directory you run in, or for a "
                "NeMo entry from the manifest's directory)"
            )
    return utterances


def parse_manifest_line(line: str, path: Path, number: int) -> Utterance:
    """One line of `path` (line `number`, for messages) as an `Utterance`."""
    return parse_manifest_record(manifest_record(line, path, number), path, number)


def manifest_record(line: str, path: Path, number: int) -> dict:
    """One line of `path` as its JSON object; anything else an error naming the line."""
    try:
        record = json.loads(line)
    except json.JSONDecodeError as err:
        raise ManifestError(f"{path}:{number}: not valid JSON ({err.msg})") from None
    if not isinstance(record, dict):
        raise ManifestError(f"{path}:{number}: expected a JSON object")
    return record


def parse_manifest_record(record: dict, path: Path, number: int) -> Utterance:
    """A manifest line's JSON object (line `number` of `path`) as an `Utterance`; the
    object is left as it was."""
    where, record = f"{path}:{number}", dict(record)
    if "audio_filepath" in record:
        return _nemo_entry(record, path, where)
    offset = _offset(record, where)
    member = record.pop("member", None)
    if member is not None and not isinstance(member, str):
        raise ManifestError(f"{where}: key 'member' must be a string (a tar member's name)")
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
    return Utterance(**{**record, "duration": float(record["duration"]), "offset": offset,
                        "member": member})  # fmt: skip


def _offset(record: dict, where: str) -> float | None:
    """The optional `offset` key, taken out of `record`."""
    if "offset" not in record:
        return None
    offset = record.pop("offset")
    if not isinstance(offset, int | float) or isinstance(offset, bool) or offset < 0:
        raise ManifestError(f"{where}: key 'offset' must be a number of seconds >= 0")
    return float(offset)


def _nemo_entry(record: dict, path: Path, where: str) -> Utterance:
    offset = _offset(dict(record), where)
    for key, kind in _NEMO_FIELDS.items():
        if key not in record:
            raise ManifestError(f"{where}: missing key {key!r} (a NeMo manifest entry)")
        if not isinstance(record[key], kind) or isinstance(record[key], bool):
            raise ManifestError(f"{where}: key {key!r} has the wrong type")
    audio = Path(record["audio_filepath"])
    if not audio.is_absolute() and (path.parent / audio).exists():
        audio = path.parent / audio
    if not record["duration"] > 0:
        raise ManifestError(f"{where}: {audio}: duration must be > 0")
    uid = str(record.get("id") or record.get("utterance_id") or Path(audio).stem)
    if offset is not None and not (record.get("id") or record.get("utterance_id")):
        uid = f"{uid}-{offset:.2f}"
    speaker = record.get("speaker", record.get("speaker_id"))
    return Utterance(uid, str(audio), float(record["duration"]), record["text"],
                     "unknown" if speaker is None else str(speaker), offset)  # fmt: skip
