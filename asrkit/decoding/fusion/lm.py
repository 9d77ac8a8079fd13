"""An n-gram LM over the model's pieces as a token automaton (shallow fusion).

The automaton's states are the LM's contexts: every listed n-gram below the highest order
(over pieces, or starting with <s>), and the empty context. From the context h a piece t
earns `weight x ln P(t | h)` (the ARPA back-off rule) and leads to the longest listed
context that ends h t; ending in h earns `weight x ln P(</s> | h)`. A search starts in
the context <s>. A negative weight subtracts the LM (LODR: a low-order LM of the training
transcripts, so that the model's own internal LM is not counted twice).

NeMo's n-gram LMs for its BPE models (its `train_kenlm.py`) write each token id k as the
character chr(k + 100); a model imported from NeMo has asrkit id k + 1 for NeMo's id k, so
such an LM is read through those names (`nemo_token_names`).
"""

from __future__ import annotations

import math

import numpy as np

from asrkit.decoding.fusion.tables import MAX_TABLE_ENTRIES, Automaton, blank_free
from asrkit.errors import InputError
from asrkit.ngram.model import END, START, UNKNOWN, UNLISTED_UNKNOWN, NGramLM
from asrkit.tokenizer import BLANK_ID

LN10 = math.log(10.0)
NEMO_TOKEN_OFFSET = 100  # NeMo's DEFAULT_TOKEN_OFFSET: token id k is written chr(k + 100)


def lm_contexts(lm: NGramLM) -> list[tuple[str, ...]]:
    """The automaton's states: the empty context and every listed n-gram below the highest
    order that a sentence can continue (no </s>, no <unk>, <s> only first), shortest
    first."""
    continued = {
        g for g in lm.probs
        if len(g) < lm.order and END not in g and UNKNOWN not in g and START not in g[1:]
    }  # fmt: skip
    return sorted(continued | {()}, key=lambda g: (len(g), g))


def nemo_token_names(vocab_size: int) -> list[str]:
    """The words a NeMo token LM uses for each asrkit id of a model imported from NeMo
    (blank first, then NeMo's ids 0.. shifted by one)."""
    return ["<blank>", *(chr(NEMO_TOKEN_OFFSET + k) for k in range(vocab_size - 1))]


def lm_token_ids(
    lm: NGramLM, pieces: list[str], name: str = "--lm", nemo_ids: bool = False
) -> dict[str, int]:
    """The token id of each word of `lm`: its words must be the model's pieces (or, with
    `nemo_ids`, NeMo's token names of them); an LM over other units (words, another
    tokenizer's pieces) is refused, naming some of them."""
    words = [w for w in lm.words if w not in (START, END, UNKNOWN)]
    ids = {piece: i for i, piece in enumerate(pieces) if i != BLANK_ID}
    foreign = [w for w in words if w not in ids]
    if foreign and nemo_ids:
        names = {piece: i for i, piece in enumerate(nemo_token_names(len(pieces))) if i}
        if all(w in names for w in words):
            ids, foreign = names, []
    if foreign:
        raise InputError(
            f"{name}: {len(foreign)} of the LM's {len(words)} words are not pieces of this "
            f"model ({', '.join(repr(w) for w in foreign[:5])}): fusion takes an LM over the "
            "model's own pieces (or, for a model imported from NeMo, NeMo's token LM of it); "
            "make one from text with `asrkit lm train`"
        )
    return ids


def lm_automaton(
    lm: NGramLM, pieces: list[str], weight: float, name: str = "--lm", nemo_ids: bool = False
) -> Automaton:
    """`lm` (over the strings of `pieces`, indexed by token id) as an `Automaton` earning
    `weight` x its natural-log probabilities. With `nemo_ids` (a model imported from NeMo)
    an LM in NeMo's token encoding is taken too. An LM over other units (words, another
    tokenizer's pieces) is refused, naming some of them."""
    ids = lm_token_ids(lm, pieces, name, nemo_ids)
    vocab = len(pieces)
    contexts = lm_contexts(lm)
    if len(contexts) * vocab > MAX_TABLE_ENTRIES:
        raise InputError(
            f"{name}: {len(contexts)} contexts x {vocab} pieces exceed {MAX_TABLE_ENTRIES:,} "
            "table entries: use a lower order or a pruned LM"
        )
    state = {context: s for s, context in enumerate(contexts)}
    column = {**ids, END: vocab}  # the last column: the end of the sentence
    unknown = lm.probs.get((UNKNOWN,), UNLISTED_UNKNOWN)
    score = np.empty((len(contexts), vocab + 1))  # log10 P(token | context)
    next_state = np.zeros((len(contexts), vocab), np.int64)
    listed: dict[tuple[str, ...], list] = {}  # context -> its listed n-grams' last words
    for ngram, value in lm.probs.items():
        if len(ngram) > 1 and ngram[:-1] in state and ngram[-1] in column:
            listed.setdefault(ngram[:-1], []).append((ngram, value))
    for s, context in enumerate(contexts):  # shorter contexts first: `back` is done
        if context:
            back = next(state[context[k:]] for k in range(1, len(context) + 1)
                        if context[k:] in state)  # fmt: skip
            score[s] = lm.backoffs.get(context, 0.0) + score[back]
            next_state[s] = next_state[back]
        else:
            score[s] = unknown
            for word, i in column.items():
                score[s, i] = lm.probs.get((word,), unknown)
                if i < vocab:
                    next_state[s, i] = state.get((word,), 0)
        for ngram, value in listed.get(context, ()):
            score[s, column[ngram[-1]]] = value
            if ngram in state:
                next_state[s, column[ngram[-1]]] = state[ngram]
    nats = score * (weight * LN10)
    steps = nats[:, :vocab].copy()
    blank_free(next_state, steps)
    return Automaton(
        next_state.astype(np.int32),
        steps.astype(np.float32),
        nats[:, vocab].astype(np.float32),
        start=state.get((START,), 0),
    )
