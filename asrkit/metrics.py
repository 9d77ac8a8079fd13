"""Word and character error rates via jiwer, with one text normalisation for both sides.

The normaliser is chosen per run (`SCORERS`) and recorded with the scores:
* `none`: the texts as they are (Unicode NFC, whitespace collapsed): case and punctuation
  count.
* `basic` (the default): Unicode-aware — NFC, case-folded, every character that is not a
  letter, a mark, a digit or an apostrophe made a space. Every letter of every script and
  every digit is kept, so "Größe" and "naïve" are one word each and "$42." is "42"; on
  A-Z text it scores as upper-casing and dropping punctuation does.
* `english`: the English normaliser the Open ASR Leaderboard scores with (Whisper's
  `EnglishTextNormalizer`, from the `whisper-normalizer` package): spellings unified,
  numbers written as digits, fillers dropped.
"""

from __future__ import annotations

import unicodedata
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache

import jiwer

SCORERS = ("none", "basic", "english")
DEFAULT_SCORER = "basic"
_APOSTROPHES = str.maketrans({"\u2019": "'", "\u02bc": "'"})


def _exact(text: str) -> str:
    return " ".join(unicodedata.normalize("NFC", text).split())


def _basic(text: str) -> str:
    text = unicodedata.normalize("NFC", text).casefold().translate(_APOSTROPHES)
    kept = (c if c == "'" or unicodedata.category(c)[0] in "LMN" else " " for c in text)
    return " ".join("".join(kept).split())


@cache
def _english() -> Callable[[str], str]:
    from whisper_normalizer.english import EnglishTextNormalizer

    english = EnglishTextNormalizer()
    return lambda text: " ".join(
        english(unicodedata.normalize("NFC", text).translate(_APOSTROPHES)).split()
    )


def normalizer(name: str = DEFAULT_SCORER) -> Callable[[str], str]:
    """The text normaliser `name` (one of SCORERS)."""
    if name not in SCORERS:
        raise ValueError(f"the scoring normaliser must be one of {SCORERS}, got {name!r}")
    return {"none": _exact, "basic": _basic}.get(name) or _english()


def normalize(text: str, name: str = DEFAULT_SCORER) -> str:
    return normalizer(name)(text)


@dataclass(frozen=True)
class ErrorRates:
    wer: float
    cer: float
    substitutions: int
    deletions: int
    insertions: int
    words: int
    normalizer: str = DEFAULT_SCORER


def error_rates(
    references: list[str], hypotheses: list[str], scorer: str = DEFAULT_SCORER
) -> ErrorRates:
    norm = normalizer(scorer)
    refs = [norm(r) for r in references]
    hyps = [norm(h) for h in hypotheses]
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
        normalizer=scorer,
    )


def word_errors(reference: str, hypothesis: str, scorer: str = DEFAULT_SCORER) -> tuple[int, int]:
    """(substitutions + deletions + insertions, reference words) of one utterance."""
    norm = normalizer(scorer)
    ref, hyp = norm(reference), norm(hypothesis)
    if not ref:
        return len(hyp.split()), 0
    out = jiwer.process_words(ref, hyp)
    return out.substitutions + out.deletions + out.insertions, len(ref.split())


def words_recognised(
    references: list[str], hypotheses: list[str], words: set[str], scorer: str = DEFAULT_SCORER
) -> tuple[int, int]:
    """(how many of the references' occurrences of `words` the hypotheses have at the same
    place, how many occurrences there are): a reference word counts where the minimum-edit
    alignment pairs it with an equal hypothesis word. `words` as the scorer normalises them
    (e.g. out-of-vocabulary words, names)."""
    norm = normalizer(scorer)
    words = {norm(w) for w in words}
    found = total = 0
    for reference, hypothesis in zip(references, hypotheses, strict=True):
        ref, hyp = norm(reference).split(), norm(hypothesis).split()
        total += sum(w in words for w in ref)
        if not ref or not hyp:
            continue
        for chunk in jiwer.process_words(" ".join(ref), " ".join(hyp)).alignments[0]:
            if chunk.type == "equal":
                found += sum(w in words for w in ref[chunk.ref_start_idx : chunk.ref_end_idx])
    return found, total
