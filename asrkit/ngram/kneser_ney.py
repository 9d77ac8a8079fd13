"""Interpolated Kneser-Ney estimation of a back-off n-gram LM, written as ARPA defines it.

Counts: the highest order counts n-grams as they occur; each lower order counts how many
different words precede an n-gram (its continuation count), except for n-grams that begin
at the sentence start, which nothing precedes (their own counts). With one discount D per
order (D = n1 / (n1 + 2 n2) from that order's counts of counts, 0.5 where that is not
defined), for a context h with counts c(h w):

    P(w | h) = max(c(h w) - D, 0) / c(h) + gamma(h) P(w | h without its first word),
    gamma(h) = D x (words seen after h) / c(h),

and the lowest order interpolates with the uniform distribution over the vocabulary.
An n-gram that occurred is listed with P(w | h); gamma(h) is h's back-off weight, so the
ARPA back-off rule reproduces the interpolated distribution for every word.
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence

from asrkit.ngram.model import END, NEVER, START, NGramLM


def estimate(sentences: Iterable[Sequence[str]], order: int, vocabulary: Iterable[str]) -> NGramLM:
    """An interpolated Kneser-Ney LM of `order` from `sentences` (each a sequence of
    words), predicting every word of `vocabulary` (plus the sentence end) with a
    probability above 0, seen or not."""
    if order < 1:
        raise ValueError(f"order must be >= 1, got {order}")
    raw: Counter = Counter()
    for words in sentences:
        padded = (START, *words, END)
        for n in range(1, order + 1):
            for i in range(len(padded) - n + 1):
                raw[padded[i : i + n]] += 1
    del raw[(START,)]
    vocab = sorted({*vocabulary, END, *(g[0] for g in raw if len(g) == 1)} - {START})
    counts = {n: Counter() for n in range(1, order + 1)}
    for ngram, count in raw.items():
        n = len(ngram)
        if n == order or ngram[0] == START:
            counts[n][ngram] = count
        if n > 1:
            counts[n - 1][ngram[1:]] += 1  # one more word seen before ngram[1:]
    probs: dict[tuple[str, ...], float] = {}
    backoffs: dict[tuple[str, ...], float] = {}
    for n in range(1, order + 1):
        discount = _discount(counts[n])
        totals: dict[tuple[str, ...], int] = defaultdict(int)
        types: dict[tuple[str, ...], int] = defaultdict(int)
        for ngram, count in counts[n].items():
            totals[ngram[:-1]] += count
            types[ngram[:-1]] += 1
        gamma = {h: discount * types[h] / totals[h] for h in totals}
        if n == 1:
            total, weight = totals[()], gamma.get((), 1.0)
            for w in vocab:
                seen = max(counts[1].get((w,), 0) - discount, 0) / total if total else 0.0
                probs[(w,)] = math.log10(seen + weight / len(vocab))
            probs[(START,)] = NEVER
        else:
            for ngram, count in counts[n].items():
                h = ngram[:-1]
                below = 10 ** _arpa_log10(probs, backoffs, ngram[1:])
                probs[ngram] = math.log10((count - discount) / totals[h] + gamma[h] * below)
        backoffs.update({h: math.log10(g) for h, g in gamma.items() if h})
    return NGramLM(order, probs, backoffs)


def _arpa_log10(probs, backoffs, ngram) -> float:
    """log10 P(ngram[-1] | ngram[:-1]) by the back-off rule over what is listed so far."""
    total = 0.0
    context, word = ngram[:-1], ngram[-1]
    while (*context, word) not in probs:
        total += backoffs.get(context, 0.0)
        context = context[1:]
    return total + probs[(*context, word)]


def _discount(counts: Counter) -> float:
    """n1 / (n1 + 2 n2) from the counts of counts; 0.5 where that is 0 or undefined."""
    n1 = sum(1 for c in counts.values() if c == 1)
    n2 = sum(1 for c in counts.values() if c == 2)
    return n1 / (n1 + 2 * n2) if n1 and n2 else 0.5
