"""Kneser-Ney estimation: a hand-computed bigram LM, every context's distribution summing
to one, and the written ARPA's back-off rule reproducing the interpolated formula."""

import itertools
import math
import random

import pytest

from asrkit.ngram import estimate


def test_a_bigram_lm_matches_the_hand_computed_one():
    """Sentences "a b" and "a" over the vocabulary {a, b, c}. Bigrams (highest order, own
    counts): <s> a 2, a b 1, a </s> 1, b </s> 1 -> D2 = n1 / (n1 + 2 n2) = 3 / 5. Unigram
    continuation counts: a 1 (after <s>), b 1, </s> 2, c 0 -> total 4, D1 = 2 / 4; the
    uniform share is over {a, b, c, </s>}: gamma = 0.5 x 3 / 4."""
    lm = estimate([["a", "b"], ["a"]], 2, ["a", "b", "c"])
    uniform = 0.375 / 4
    unigram = {"a": 0.5 / 4 + uniform, "b": 0.5 / 4 + uniform, "</s>": 1.5 / 4 + uniform,
               "c": uniform}  # fmt: skip
    for word, p in unigram.items():
        assert lm.log10_prob(word) == pytest.approx(math.log10(p))
    table = [
        ("a", "<s>", 1.4 / 2 + 0.3 * unigram["a"]),  # gamma(<s>) = 0.6 x 1 / 2
        ("b", "a", 0.4 / 2 + 0.6 * unigram["b"]),  # gamma(a) = 0.6 x 2 / 2
        ("</s>", "a", 0.4 / 2 + 0.6 * unigram["</s>"]),
        ("</s>", "b", 0.4 / 1 + 0.6 * unigram["</s>"]),  # gamma(b) = 0.6 x 1 / 1
        ("c", "a", 0.6 * unigram["c"]),  # unseen after a: backed off
        ("b", "<s>", 0.3 * unigram["b"]),
    ]
    for word, previous, p in table:
        assert lm.log10_prob(word, [previous]) == pytest.approx(math.log10(p)), (word, previous)
    assert lm.probs[("<s>",)] == -99.0


@pytest.mark.parametrize("order", [1, 2, 3, 4])
def test_every_context_is_a_distribution_over_the_vocabulary(order):
    rng = random.Random(order)
    words = list("abcdef")
    text = [[rng.choice(words[:5]) for _ in range(rng.randint(0, 7))] for _ in range(50)]
    lm = estimate(text, order, words)
    predicted = [*words, "</s>"]
    contexts = itertools.chain(
        [()], *(itertools.product(["<s>", *words], repeat=k) for k in range(1, order))
    )
    checked = 0
    for context in contexts:
        if "<s>" in context[1:]:
            continue
        total = sum(10 ** lm.log10_prob(w, context) for w in predicted)
        assert total == pytest.approx(1.0, abs=1e-9), context
        assert all(lm.log10_prob(w, context) > -99 for w in predicted)  # nothing impossible
        checked += 1
    assert checked > 1 or order == 1


def test_an_empty_text_gives_the_uniform_distribution():
    lm = estimate([], 3, ["a", "b", "c"])
    for word in ("a", "b", "c", "</s>"):
        assert lm.log10_prob(word, ["<s>", "a"]) == pytest.approx(math.log10(0.25))


def test_an_order_below_one_is_refused():
    with pytest.raises(ValueError, match="order must be >= 1"):
        estimate([["a"]], 0, ["a"])
