"""Transcripts as text lines, JSON lines and SubRip (SRT) subtitles."""

from __future__ import annotations

import json

from asrkit.decoding.transcribe import Transcript
from asrkit.decoding.words import Word

FORMATS = ("text", "json", "srt")
CUE_MAX_WORDS = 12
CUE_MAX_SECONDS = 6.0
# A pause this long starts a new subtitle: between sentences joined by 0.6 s of silence the
# words around it measured 0.75 s apart, inside sentences at most 0.17 s (the demo's model).
CUE_BREAK_SECONDS = 0.5


def as_text(transcript: Transcript) -> str:
    return f"{transcript.path}\t{transcript.text}"


def as_json(transcript: Transcript, nbest: int = 0) -> str:
    """One JSON object on one line: file, duration, text, words (word, start, end,
    confidence), windows, and with `nbest` > 0 up to that many hypotheses (text, score)."""
    record = {
        "file": transcript.path,
        "duration": round(transcript.duration, 3),
        "text": transcript.text,
        "words": [
            {
                "word": w.text,
                "start": round(w.start, 3),
                "end": round(w.end, 3),
                "confidence": round(w.confidence, 4),
            }
            for w in transcript.words
        ],
        "windows": transcript.windows,
    }
    if nbest > 0:
        record["nbest"] = [
            {"text": h.text, "score": round(h.score, 4)} for h in transcript.nbest[:nbest]
        ]
    return json.dumps(record, ensure_ascii=False)


def as_srt(transcript: Transcript) -> str:
    """Numbered cues of up to CUE_MAX_WORDS words / CUE_MAX_SECONDS, broken at pauses."""
    blocks = []
    for number, cue in enumerate(_cues(transcript.words), start=1):
        span = f"{_srt_time(cue[0].start)} --> {_srt_time(cue[-1].end)}"
        blocks.append(f"{number}\n{span}\n{' '.join(w.text for w in cue)}\n")
    return "\n".join(blocks)


def _cues(words: list[Word]) -> list[list[Word]]:
    cues: list[list[Word]] = []
    for word in words:
        if cues and (
            len(cues[-1]) < CUE_MAX_WORDS
            and word.end - cues[-1][0].start <= CUE_MAX_SECONDS
            and word.start - cues[-1][-1].end < CUE_BREAK_SECONDS
        ):
            cues[-1].append(word)
        else:
            cues.append([word])
    return cues


def _srt_time(seconds: float) -> str:
    millis = max(0, round(seconds * 1000))
    hours, millis = divmod(millis, 3_600_000)
    minutes, millis = divmod(millis, 60_000)
    secs, millis = divmod(millis, 1000)
    return f"{hours:02d}:{minutes:02d}:{secs:02d},{millis:03d}"
