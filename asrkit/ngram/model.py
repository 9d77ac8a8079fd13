"""A back-off n-gram LM as the ARPA format defines it (log10 probabilities)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

START, END, UNKNOWN = "<s>", "</s>", "<unk>"
NEVER = -99.0  # log10 probability of what an LM cannot produce (ARPA's convention: <s>)
UNLISTED_UNKNOWN = -100.0  # log10 P(<unk>) of an LM that does not list it (KenLM's value)


@dataclass(frozen=True)
class NGramLM:
    """`probs[ngram]`: log10 P(last word | the words before it), for every listed n-gram;
    `backoffs[context]`: log10 back-off weight of a listed n-gram (absent: 0)."""

    order: int
    probs: dict[tuple[str, ...], float]
    backoffs: dict[tuple[str, ...], float]

    @property
    def words(self) -> list[str]:
        return [ngram[0] for ngram in self.probs if len(ngram) == 1]

    def log10_prob(self, word: str, history: Sequence[str] = ()) -> float:
        """log10 P(word | history) by the ARPA rule: the longest listed n-gram ending in
        `word`, after the back-off weights of the longer contexts. A word the LM does not
        list scores as <unk> (UNLISTED_UNKNOWN where the LM lists no <unk>)."""
        context = tuple(history)[max(len(history) - self.order + 1, 0) :] if self.order > 1 else ()
        if (word,) not in self.probs:
            word = UNKNOWN
        total = 0.0
        while True:
            ngram = (*context, word)
            if ngram in self.probs:
                return total + self.probs[ngram]
            if not context:
                return total + UNLISTED_UNKNOWN
            total += self.backoffs.get(context, 0.0)
            context = context[1:]

    def sentence_log10(self, words: Sequence[str]) -> float:
        """log10 P(<s> words </s>): every word and the end, from the start context."""
        history = [START]
        total = 0.0
        for word in [*words, END]:
            total += self.log10_prob(word, history)
            history.append(word)
        return total
