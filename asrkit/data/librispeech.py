"""LibriSpeech-layout corpus preparation: scan, validate, write JSONL manifests.

Layout: `<root>/<part>/<speaker>/<chapter>/<speaker>-<chapter>-<utt>.flac` beside
`<speaker>-<chapter>.trans.txt` ("<utt-id> TRANSCRIPT" per line). Every problem is reported
by utterance id and counted; nothing bad reaches a manifest. Audio headers are read in
parallel threads (libsndfile releases the GIL).
"""

from __future__ import annotations

import dataclasses
import os
import unicodedata
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from asrkit.audio import SAMPLE_RATE, AudioError, audio_info
from asrkit.data.manifest import Utterance, write_manifest
from asrkit.progress import progress

DEFAULT_ALPHABET = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZ' ")  # LibriSpeech's own
ANY_TEXT = None  # `alphabet`: any Unicode text (NFC) without control characters
AUDIO_SUFFIXES = (".flac", ".wav")


@dataclass(frozen=True)
class Problem:
    utterance_id: str
    kind: str  # missing_audio | missing_transcript | unreadable_audio | empty_text | ...
    detail: str


@dataclass
class PartReport:
    part: str
    manifest: Path | None
    kept: int = 0
    duration: float = 0.0  # seconds kept
    problems: list[Problem] = field(default_factory=list)

    def counts(self) -> Counter:
        return Counter(p.kind for p in self.problems)


@dataclass(frozen=True)
class _Candidate:
    utterance_id: str
    speaker: str
    text: str | None  # None: audio without a transcript line
    audio: Path | None  # None: transcript line without audio


def prepare_librispeech(
    root: str | os.PathLike,
    parts: list[str],
    out_dir: str | os.PathLike,
    *,
    resample: bool = True,
    alphabet: frozenset[str] | None = DEFAULT_ALPHABET,
    workers: int = 8,
    show_progress: bool = True,
) -> list[PartReport]:
    """Writes `<out_dir>/<part>.jsonl` for each part and returns what was kept and rejected.

    With `resample=False`, audio whose sample rate is not 16 kHz is rejected as a
    `sample_rate` problem; otherwise it is kept and `asrkit.audio.read_audio` resamples it.
    """
    root, out_dir = Path(root), Path(out_dir)
    reports = []
    for part in parts:
        part_dir = root / part
        if not part_dir.is_dir():
            raise FileNotFoundError(f"{part_dir}: no such part directory under {root}")
        candidates = _scan_part(part_dir)
        report = PartReport(part=part, manifest=out_dir / f"{part}.jsonl")
        checked = _check_all(candidates, resample, alphabet, workers, show_progress, part)
        kept = []
        for outcome in checked:
            if isinstance(outcome, Problem):
                report.problems.append(outcome)
            else:
                kept.append(outcome)
        kept.sort(key=lambda u: u.id)
        write_manifest(report.manifest, kept)
        report.kept = len(kept)
        report.duration = sum(u.duration for u in kept)
        reports.append(report)
    return reports


def _scan_part(part_dir: Path) -> list[_Candidate]:
    candidates = []
    for chapter_dir in sorted(p for p in part_dir.glob("*/*") if p.is_dir()):
        speaker = chapter_dir.parent.name
        audio = {p.stem: p for p in chapter_dir.iterdir() if p.suffix.lower() in AUDIO_SUFFIXES}
        texts: dict[str, str] = {}
        for trans in sorted(chapter_dir.glob("*.trans.txt")):
            for line in trans.read_text(encoding="utf-8", errors="replace").splitlines():
                if line.strip():
                    utt_id, _, text = line.strip().partition(" ")
                    texts[utt_id] = text.strip()
        for utt_id in sorted(set(audio) | set(texts)):
            candidates.append(_Candidate(utt_id, speaker, texts.get(utt_id), audio.get(utt_id)))
    return candidates


def _check_all(candidates, resample, alphabet, workers, show_progress, label):
    def check(candidate):
        return _check(candidate, resample, alphabet)

    with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
        results = pool.map(check, candidates)
        return list(progress(results, total=len(candidates), label=label, enabled=show_progress))


def _check(c: _Candidate, resample: bool, alphabet: frozenset[str] | None) -> Utterance | Problem:
    if c.audio is None:
        return Problem(c.utterance_id, "missing_audio", "transcript line without an audio file")
    if c.text is None:
        return Problem(c.utterance_id, "missing_transcript", f"{c.audio} has no transcript line")
    if not c.text:
        return Problem(c.utterance_id, "empty_text", "empty transcript")
    if alphabet is ANY_TEXT:
        text = unicodedata.normalize("NFC", c.text)
        bad = sorted({ch for ch in text if unicodedata.category(ch)[0] == "C"})
        if bad:
            return Problem(c.utterance_id, "bad_characters", f"control characters: {bad}")
        c = dataclasses.replace(c, text=text)
    else:
        bad = sorted(set(c.text) - alphabet)
        if bad:
            return Problem(
                c.utterance_id, "bad_characters", f"characters outside the alphabet: {bad}"
            )
    try:
        info = audio_info(c.audio)
    except AudioError as err:
        return Problem(c.utterance_id, "unreadable_audio", str(err))
    if info.num_samples == 0:
        return Problem(c.utterance_id, "unreadable_audio", f"{c.audio} has no samples")
    if info.sample_rate != SAMPLE_RATE and not resample:
        return Problem(
            c.utterance_id,
            "sample_rate",
            f"{c.audio} is {info.sample_rate} Hz, not {SAMPLE_RATE} (allow resampling to keep it)",
        )
    return Utterance(c.utterance_id, str(c.audio.resolve()), info.duration, c.text, c.speaker)


def summarize(reports: list[PartReport], max_listed: int = 20) -> str:
    """A human-readable summary: per part, what was kept and each problem by utterance id."""
    lines = []
    for r in reports:
        hours = r.duration / 3600
        lines.append(f"{r.part}: kept {r.kept} utterances ({hours:.2f} h) -> {r.manifest}")
        for kind, n in sorted(r.counts().items()):
            lines.append(f"  {kind}: {n}")
        for p in r.problems[:max_listed]:
            lines.append(f"    {p.utterance_id}: {p.kind}: {p.detail}")
        if len(r.problems) > max_listed:
            lines.append(f"    ... and {len(r.problems) - max_listed} more")
    return "\n".join(lines)
