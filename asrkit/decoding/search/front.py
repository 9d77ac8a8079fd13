"""One front for every search: options, typed results, compiled per (model, options).

`decode_batch` encodes a padded feature batch and runs greedy or beam search (modified beam
search; for TDT models, their own greedy and beam searches) or, on a hybrid network, greedy
CTC search, in one compiled graph; every search returns the same `Hypothesis`.
`decode_nbest` returns each utterance's n-best list (beam search: the beam, best first;
greedy: one).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import tensorflow as tf

from asrkit.config import DecodeConfig
from asrkit.decoding.fusion.steps import as_tensors
from asrkit.decoding.fusion.tables import FusionTables
from asrkit.decoding.search.beam import beam_search, live_slots
from asrkit.decoding.search.ctc_greedy import ctc_greedy_search
from asrkit.decoding.search.found import Found
from asrkit.decoding.search.greedy import greedy_continue, greedy_search, greedy_start
from asrkit.decoding.search.strategies import check, decoder_of
from asrkit.decoding.search.tdt_beam import tdt_beam_search
from asrkit.decoding.search.tdt_greedy import (
    tdt_greedy_continue,
    tdt_greedy_search,
    tdt_greedy_start,
)

SYMBOLS = DecodeConfig.max_symbols_per_step  # the config's default, defined there once


@dataclass(frozen=True)
class Hypothesis:
    """One utterance's result."""

    tokens: list[int]
    frames: list[int]  # encoder frame at which each token was emitted
    score: float  # log-probability: Σ log-probs of every decision (blanks included)
    text: str = ""
    token_log_probs: list[float] = field(default_factory=list)  # each token where emitted


# The search settings are the decoding config: method, beam, symbols per frame and the
# fusion weights in one frozen dataclass (`asrkit.config.DecodeConfig`).
DecodeOptions = DecodeConfig

DEFAULT_OPTIONS = DecodeOptions()


def decode_batch(
    model, features, feature_lengths, tokenizer=None, options: DecodeOptions | None = None,
    boost: FusionTables | None = None,
) -> list[Hypothesis]:  # fmt: skip
    """features [B, T, F], feature_lengths [B] -> the best `Hypothesis` of each utterance
    (`boost`: word boosting and LM tables, `asrkit.decoding.fusion.tables`)."""
    found = _search(model, features, feature_lengths, options, boost)
    return [hypotheses[0] for hypotheses in found_hypotheses(found, tokenizer, limit=1)]


def decode_nbest(
    model, features, feature_lengths, tokenizer=None, options: DecodeOptions | None = None,
    boost: FusionTables | None = None,
) -> list[list[Hypothesis]]:  # fmt: skip
    """features [B, T, F], feature_lengths [B] -> each utterance's hypotheses, best first
    (beam search: up to `options.beam`, empty beam slots left out; greedy: one)."""
    found = _search(model, features, feature_lengths, options, boost)
    return found_hypotheses(found, tokenizer)


def _search(model, features, feature_lengths, options, boost=None) -> Found:
    inputs = (tf.convert_to_tensor(features, tf.float32),
              tf.convert_to_tensor(feature_lengths, tf.int32))  # fmt: skip
    options = options or DEFAULT_OPTIONS
    if boost is None:
        return _compiled(model, options, boosted=False)(*inputs)
    return _compiled(model, options, boosted=True)(*inputs, as_tensors(boost))


def found_hypotheses(found: Found, tokenizer, limit: int | None = None) -> list[list[Hypothesis]]:
    """Each row's live hypotheses (at most `limit`, best first) as `Hypothesis` objects."""
    alive = live_slots(found.scores).numpy()
    tokens, frames, log_probs, counts, scores = (x.numpy() for x in found)
    out = []
    for row in range(counts.shape[0]):
        hyps = []
        for k in np.flatnonzero(alive[row])[:limit]:
            n = int(counts[row, k])
            ids = tokens[row, k, :n].tolist()
            text = tokenizer.decode(ids) if tokenizer is not None else ""
            hyps.append(
                Hypothesis(
                    ids,
                    frames[row, k, :n].tolist(),
                    float(scores[row, k]),
                    text,
                    log_probs[row, k, :n].tolist(),
                )
            )
        out.append(hyps)
    return out


def greedy_decode(
    model, features, feature_lengths, tokenizer=None, max_symbols_per_step: int = SYMBOLS
) -> list[Hypothesis]:
    options = DecodeOptions("greedy", max_symbols_per_step=max_symbols_per_step)
    return decode_batch(model, features, feature_lengths, tokenizer, options)


def beam_decode(
    model,
    features,
    feature_lengths,
    tokenizer=None,
    beam: int = 4,
    max_symbols_per_step: int = SYMBOLS,
) -> list[Hypothesis]:
    options = DecodeOptions("beam", beam, max_symbols_per_step)
    return decode_batch(model, features, feature_lengths, tokenizer, options)


def search(model, encoded, encoder_lengths, options: DecodeOptions, boost=None) -> Found:
    """Each row's hypotheses as graph tensors, best first: `Found` with a K axis
    ([B, K, N] tokens, [B, K] counts and scores; K = the beam, or 1 for greedy).
    `boost`: fusion tables as tensors (word boosting, LM; the strategies that take them).
    Which search runs is the strategy table's row (`asrkit.decoding.search.strategies`)."""
    decoder = decoder_of(options.method, model.joint.durations, model.ctc_head is not None)
    if boost is not None:
        check(options.method, fusion=("--boost",))
    return _SEARCHES[decoder, options.method](model, encoded, encoder_lengths, options, boost)


def _one(found) -> Found:
    """A search of one hypothesis per row, with the K axis of 1."""
    return Found(*(x[:, None] for x in found))


_SEARCHES = {  # one per row of STRATEGIES
    ("rnnt", "greedy"): lambda model, encoded, lengths, options, boost: _one(greedy_search(
        model, encoded, lengths, options.max_symbols_per_step, boost=boost)),
    ("rnnt", "beam"): lambda model, encoded, lengths, options, boost: beam_search(
        model, encoded, lengths, options.beam, options.max_symbols_per_step, boost=boost),
    ("tdt", "greedy"): lambda model, encoded, lengths, options, boost: _one(tdt_greedy_search(
        model, encoded, lengths, options.max_symbols_per_step, boost=boost)),
    ("tdt", "beam"): lambda model, encoded, lengths, options, boost: tdt_beam_search(
        model, encoded, lengths, options.beam, options.max_symbols_per_step, boost),
    ("ctc", "ctc"): lambda model, encoded, lengths, options, boost: _one(ctc_greedy_search(
        model, encoded, lengths)),
}  # fmt: skip


# How a stream starts and continues a greedy search (a row of STRATEGIES that streams with
# one hypothesis; the beam's stream steps are `asrkit.decoding.search.beam`'s).
GREEDY_STREAM_STEPS = {
    ("rnnt", "greedy"): (greedy_start, greedy_continue),
    ("tdt", "greedy"): (tdt_greedy_start, tdt_greedy_continue),
}


def describe(options: DecodeOptions) -> str:
    if options.method == "ctc":
        return "greedy CTC search (the CTC head)"
    name = f"beam search, beam {options.beam}" if options.method == "beam" else "greedy search"
    return f"{name}, at most {options.max_symbols_per_step} symbol(s) per encoder frame"


def _compiled(model, options: DecodeOptions, boosted: bool = False):
    cache = model.__dict__.setdefault("_asrkit_search", {})
    key = (options, boosted)
    if key not in cache:

        @tf.function(reduce_retracing=True, autograph=False)
        def run(features, feature_lengths, boost=None):
            encoded, lengths = model.encode(features, feature_lengths, training=False)
            return search(model, encoded, lengths, options, boost)

        cache[key] = run
    return cache[key]
