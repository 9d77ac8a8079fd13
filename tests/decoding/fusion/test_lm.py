"""n-gram LM fusion: the LM's automaton against the LM's own sentence scores, and the
searches with an LM (with LODR and boosting beside it) against exhaustive rescoring of
every path, an eager frame-by-frame greedy search, and weight 0."""

import math
import random

import numpy as np
import pytest
import tensorflow as tf

from asrkit.decoding.fusion.boosting import boost_tables
from asrkit.decoding.fusion.lm import lm_automaton
from asrkit.decoding.fusion.steps import as_tensors
from asrkit.decoding.fusion.tables import combine
from asrkit.decoding.search.beam import live_slots
from asrkit.decoding.search.front import DecodeOptions, decode_batch, decode_nbest
from asrkit.errors import InputError
from asrkit.ngram import estimate
from asrkit.tokenizer import BLANK_ID
from tests.decoding.conftest import random_features, tiny_transducer
from tests.decoding.fusion.test_boosting import brute_total
from tests.decoding.search.test_beam import brute_force

LN10 = math.log(10)


def _pieces(vocab_size):
    return ["<blank>", *(f"p{i}" for i in range(1, vocab_size))]


def _lm_of(sequences, vocab_size, order):
    """An LM over the pieces p1.. of `sequences` (token ids)."""
    pieces = _pieces(vocab_size)
    return estimate([[pieces[t] for t in s] for s in sequences], order, pieces[1:])


def _walk(tables, tokens):
    """What the combined automata earn along `tokens`, ending included (NumPy)."""
    where, total = tables.start.copy(), 0.0
    for token in tokens:
        total += float(tables.bonus[where, token].sum())
        where = tables.next_state[where, token]
    return total + float(tables.final[where].sum())


@pytest.mark.parametrize("order", [1, 2, 3, 4])
def test_the_automaton_earns_the_weighted_log_probability_of_every_sentence(order):
    rng = random.Random(order)
    vocab = 6
    text = [[rng.randrange(1, vocab - 1) for _ in range(rng.randint(0, 8))] for _ in range(40)]
    lm = _lm_of(text, vocab, order)
    automaton = lm_automaton(lm, _pieces(vocab), 0.7)
    tables = combine(automaton)
    pieces = _pieces(vocab)
    for _ in range(200):
        tokens = [rng.randrange(1, vocab) for _ in range(rng.randint(0, 9))]
        want = 0.7 * LN10 * lm.sentence_log10([pieces[t] for t in tokens])
        assert _walk(tables, tokens) == pytest.approx(want, abs=1e-3)
    states = np.arange(len(automaton.final))
    assert np.all(automaton.next_state[:, BLANK_ID] == states)  # blank moves nothing
    assert not automaton.bonus[:, BLANK_ID].any()


def test_combined_automata_earn_the_sum_of_each():
    rng = random.Random(5)
    text = [[rng.randrange(1, 5) for _ in range(rng.randint(1, 6))] for _ in range(30)]
    lm, low = _lm_of(text, 6, 3), _lm_of(text[:10], 6, 2)
    parts = [boost_tables({(1, 2): 1.5, (2, 3, 4): 0.5}, 6),
             lm_automaton(lm, _pieces(6), 0.4), lm_automaton(low, _pieces(6), -0.2)]  # fmt: skip
    both = combine(*parts)
    for _ in range(100):
        tokens = [rng.randrange(1, 6) for _ in range(rng.randint(0, 9))]
        alone = sum(_walk(combine(p), tokens) for p in parts)
        assert _walk(both, tokens) == pytest.approx(alone, abs=1e-4)


def test_an_lm_over_other_units_is_refused_naming_them():
    words = estimate([["hello", "world"]], 2, ["hello", "world"])
    with pytest.raises(InputError, match=r"--lm: 2 of the LM's 2 words are not pieces of this "
                       r"model \('hello', 'world'\).*asrkit lm train"):  # fmt: skip
        lm_automaton(words, _pieces(5), 0.3)


def test_a_big_lm_is_refused_before_its_tables_are_built(monkeypatch):
    import asrkit.decoding.fusion.lm as lm_fusion

    monkeypatch.setattr(lm_fusion, "MAX_TABLE_ENTRIES", 20)
    with pytest.raises(InputError, match="use a lower order or a pruned LM"):
        lm_automaton(_lm_of([[1, 2, 3, 1]], 6, 3), _pieces(6), 0.3)


# --- the searches with an LM -----------------------------------------------------------


@pytest.mark.parametrize("max_symbols", [1, 2])
def test_a_wide_beam_with_lm_lodr_and_boosting_finds_the_best_rescored_sequence(max_symbols):
    """Every path enumerated (`brute_force`), each sequence's log-probability plus its LM
    score (the LM's own sentence score x weight), minus the LODR LM's, plus its boosting
    bonus: a beam that prunes nothing finds the best of those, with that score, and ranks
    every sequence as rescoring does. The LM favours a sequence the model alone does not."""
    model = tiny_transducer(vocab_size=3, seed=8, blank_bias=0.0)
    feature_frames = 19 if max_symbols == 1 else 15
    feats = random_features([feature_frames], seed=3)[0]
    exact = brute_force(model, feats, max_symbols)
    plain_best = max(exact, key=exact.get)
    runner_up = sorted((s for s in exact if s != plain_best and len(s) >= 2), key=exact.get)[-2]
    lm, low = _lm_of([runner_up] * 3 + [plain_best[:1]], 3, 3), _lm_of([plain_best], 3, 1)
    pieces = _pieces(3)
    boost = {runner_up[-2:]: 0.5}
    tables = combine(boost_tables(boost, 3), lm_automaton(lm, pieces, 0.8),
                     lm_automaton(low, pieces, -0.3))  # fmt: skip

    def rescored(s):
        words = [pieces[t] for t in s]
        return (
            exact[s]
            + 0.8 * LN10 * lm.sentence_log10(words)
            - 0.3 * LN10 * low.sentence_log10(words)
            + brute_total(s, boost)
        )

    want = {s: rescored(s) for s in exact}
    best = max(want, key=want.get)
    assert best != plain_best
    options = DecodeOptions("beam", 256, max_symbols)
    found = decode_nbest(model, feats[None], [feature_frames], options=options, boost=tables)[0]
    assert tuple(found[0].tokens) == best
    assert found[0].score == pytest.approx(want[best], abs=2e-4)
    top = sorted(want, key=want.get, reverse=True)[:10]
    assert [tuple(h.tokens) for h in found[:10]] == top
    for hypothesis in found[:10]:
        assert hypothesis.score == pytest.approx(want[tuple(hypothesis.tokens)], abs=2e-4)


def test_a_wide_tdt_beam_with_an_lm_scores_every_sequence_as_rescoring_does():
    from asrkit.decoding.search.tdt_beam import tdt_beam_search
    from tests.decoding.search.test_tdt_beam import every_sequence, tdt_transducer

    model = tdt_transducer(vocab_size=3, durations=(0, 1, 2), seed=5)
    encoded = tf.constant(np.random.default_rng(3).standard_normal((1, 3, 16)), tf.float32)
    exact = every_sequence(model, encoded[0], 3, max_symbols=2)
    plain_best = max(exact, key=exact.get)
    runner_up = max((s for s in exact if s != plain_best and len(s) >= 2), key=exact.get)
    lm = _lm_of([runner_up] * 4, 3, 2)
    pieces = _pieces(3)
    tables = combine(lm_automaton(lm, pieces, 0.5))
    found = tdt_beam_search(model, encoded, tf.constant([3]), 640, 2, boost=as_tensors(tables))
    alive = live_slots(found.scores).numpy()[0]
    beam = {tuple(found.tokens[0, k, : found.counts[0, k]].numpy().tolist()):
            float(found.scores[0, k]) for k in np.flatnonzero(alive)}  # fmt: skip
    assert sorted(beam) == sorted(exact)
    for tokens, log_p in exact.items():
        lm_score = 0.5 * LN10 * lm.sentence_log10([pieces[t] for t in tokens])
        assert beam[tokens] == pytest.approx(log_p + lm_score, abs=2e-4)
    best = max(beam, key=beam.get)
    assert best != plain_best and tuple(found.tokens[0, 0, : found.counts[0, 0]]) == best


LENGTHS = [60, 37, 21, 9]


def _eager_fused_greedy(model, features, length, tables, max_symbols):
    """Frame by frame, eager: at each frame symbols until blank, each the argmax of
    log-prob + what the row's automata earn from their states."""
    encoded, lengths = model.encode(features[None, :length], tf.constant([length]))
    out, state = model.predictor.step(tf.constant([BLANK_ID]), model.predictor.initial_state(1))
    where, tokens = tables.start.copy(), []
    for t in range(int(lengths[0])):
        for _ in range(max_symbols):
            log_probs = tf.nn.log_softmax(model.join(encoded[:, t], out))[0].numpy()
            symbol = int(np.argmax(log_probs + tables.bonus[where].sum(axis=0)))
            if symbol == BLANK_ID:
                break
            tokens.append(symbol)
            where = tables.next_state[where, symbol]
            out, state = model.predictor.step(tf.constant([symbol]), state)
    return tokens


def _lm_near(model, feats, order=3):
    """An LM of sequences greedy search almost emits (its own output, shifted)."""
    plain = decode_batch(model, feats, LENGTHS, options=DecodeOptions("greedy"))
    shifted = [[t % (model.vocab_size - 1) + 1 for t in h.tokens] for h in plain]
    return _lm_of(shifted * 3, model.vocab_size, order)


def test_greedy_search_with_an_lm_takes_the_eager_searchs_decisions(model):
    feats = random_features(LENGTHS, seed=5)
    pieces = _pieces(model.vocab_size)
    tables = combine(lm_automaton(_lm_near(model, feats), pieces, 0.6),
                     boost_tables({(2, 3): 1.0}, model.vocab_size))  # fmt: skip
    options = DecodeOptions("greedy", max_symbols_per_step=3)
    found = decode_batch(model, feats, LENGTHS, options=options, boost=tables)
    plain = decode_batch(model, feats, LENGTHS, options=options)
    assert any(f.tokens != p.tokens for f, p in zip(found, plain, strict=True))  # it acts
    for b, n in enumerate(LENGTHS):
        assert found[b].tokens == _eager_fused_greedy(model, feats[b], n, tables, 3)


@pytest.mark.parametrize("method", ["greedy", "beam"])
def test_lm_weight_zero_is_no_lm_bit_for_bit(model, method):
    feats = random_features(LENGTHS, seed=6)
    tables = combine(lm_automaton(_lm_near(model, feats), _pieces(model.vocab_size), 0.0))
    options = DecodeOptions(method, beam=4)
    plain = decode_nbest(model, feats, LENGTHS, options=options)
    assert decode_nbest(model, feats, LENGTHS, options=options, boost=tables) == plain


def test_a_nemo_token_lm_scores_as_nemo_scores_it_for_an_imported_model():
    """NeMo's own `NGramGPULanguageModel` scored token sequences over a committed LM in
    NeMo's token encoding (`tools/fixture_nemo_lm.py`): at every step every token's score,
    and the end. The same file, read for a model imported from NeMo (asrkit id = NeMo id +
    1, blank first), earns the same; a model not imported from NeMo refuses it."""
    import json
    from pathlib import Path

    from asrkit.ngram import read_arpa

    data = Path(__file__).resolve().parents[2] / "data" / "lm"
    lm = read_arpa(data / "nemo_tokens3.arpa")
    rows = json.loads((data / "nemo_lm_scores.json").read_text())
    vocab = len(rows[0]["steps"][0]) + 1 if rows[0]["steps"] else 31
    pieces = [f"piece{i}" for i in range(vocab)]
    automaton = lm_automaton(lm, pieces, 1.0, nemo_ids=True)
    assert sum(len(r["steps"]) for r in rows) >= 30
    for row in rows:
        state = automaton.start
        for token, nemo_scores in zip(row["tokens"], row["steps"], strict=True):
            np.testing.assert_allclose(automaton.bonus[state, 1:], nemo_scores, atol=2e-5)
            state = automaton.next_state[state, token + 1]
        assert automaton.final[state] == pytest.approx(row["final"], abs=2e-5)
    with pytest.raises(InputError, match="not pieces of this model"):
        lm_automaton(lm, pieces, 1.0)
