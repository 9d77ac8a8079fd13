"""Word and character error rates via jiwer, with one text normalisation for both sides."""

from __future__ import annotations

import re
from dataclasses import dataclass

import jiwer

_SPACES = re.compile(r"\s+")


def normalize(text: str) -> str:
    """Upper case, apostrophes kept, other punctuation dropped, single spaces."""
    text = re.sub(r"[^A-Z' ]", " ", text.upper())
    return _SPACES.sub(" ", text).strip()


@dataclass(frozen=True)
class ErrorRates:
    wer: float
    cer: float
    substitutions: int
    deletions: int
    insertions: int
    words: int


def error_rates(references: list[str], hypotheses: list[str]) -> ErrorRates:
    refs = [normalize(r) for r in references]
    hyps = [normalize(h) for h in hypotheses]
    if not any(refs):
        raise ValueError("error_rates: every reference is empty")
    words = jiwer.process_words(refs, hyps)
    chars = jiwer.cer(refs, hyps)
    return ErrorRates(
        wer=words.wer,
        cer=float(chars),
        substitutions=words.substitutions,
        deletions=words.deletions,
        insertions=words.insertions,
        words=sum(len(r.split()) for r in refs),
    )


def word_errors(reference: str, hypothesis: str) -> tuple[int, int]:
    """(substitutions + deletions + insertions, reference words) of one utterance."""
    ref, hyp = normalize(reference), normalize(hypothesis)
    if not ref:
        return len(hyp.split()), 0
    out = jiwer.process_words(ref, hyp)
    return out.substitutions + out.deletions + out.insertions, len(ref.split())
