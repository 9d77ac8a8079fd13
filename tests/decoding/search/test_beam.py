"""Modified beam search against greedy search, itself batched, and a brute-force search."""

import numpy as np
import pytest
import tensorflow as tf

from asrkit.decoding import beam_decode, greedy_decode
from asrkit.features import encoder_frames
from asrkit.tokenizer import BLANK_ID
from tests.decoding.conftest import random_features, tiny_transducer

LENGTHS = [60, 37, 21, 9]


@pytest.mark.parametrize("max_symbols", [1, 3])
def test_beam_of_one_is_greedy(model, max_symbols):
    feats = random_features(LENGTHS)
    greedy = greedy_decode(model, feats, LENGTHS, max_symbols_per_step=max_symbols)
    beam = beam_decode(model, feats, LENGTHS, beam=1, max_symbols_per_step=max_symbols)
    assert sum(len(h.tokens) for h in greedy) > 0
    for g, b in zip(greedy, beam, strict=True):
        assert b.tokens == g.tokens
        assert b.frames == g.frames
        assert b.score == pytest.approx(g.score, rel=1e-5, abs=1e-4)


@pytest.mark.parametrize("beam,max_symbols", [(2, 1), (4, 1), (8, 1), (4, 3)])
def test_beam_score_is_at_least_greedy(model, beam, max_symbols):
    feats = random_features(LENGTHS, seed=1)
    greedy = greedy_decode(model, feats, LENGTHS, max_symbols_per_step=max_symbols)
    found = beam_decode(model, feats, LENGTHS, beam=beam, max_symbols_per_step=max_symbols)
    for g, b, n in zip(greedy, found, LENGTHS, strict=True):
        assert b.score >= g.score - 1e-4
        assert all(t != BLANK_ID for t in b.tokens)
        if b.frames:
            assert max(np.bincount(b.frames)) <= max_symbols
            assert max(b.frames) < encoder_frames(n)


@pytest.mark.parametrize("max_symbols", [1, 2])
def test_batched_beam_equals_one_by_one(model, max_symbols):
    feats = random_features(LENGTHS, seed=2)
    batched = beam_decode(model, feats, LENGTHS, beam=4, max_symbols_per_step=max_symbols)
    for b, n in enumerate(LENGTHS):
        alone = beam_decode(
            model, feats[b : b + 1, :n], [n], beam=4, max_symbols_per_step=max_symbols
        )
        alone = alone[0]
        assert batched[b].tokens == alone.tokens
        assert batched[b].frames == alone.frames
        assert batched[b].score == pytest.approx(alone.score, rel=1e-5, abs=1e-4)


def brute_force(model, features, max_symbols):
    """log P(sequence) for every token sequence, summed over all its alignments: at each
    encoder frame, symbols until blank, at most `max_symbols` (the last one ends the frame,
    as in greedy search) — an exhaustive recursive enumeration, one utterance, eager."""
    encoded, lengths = model.encode(features[None], tf.constant([len(features)]))
    num_frames = int(lengths[0])
    totals: dict[tuple[int, ...], list[float]] = {}

    def walk(t, emitted, prefix, log_p, out, state):
        if t == num_frames:
            totals.setdefault(tuple(prefix), []).append(log_p)
            return
        log_probs = tf.nn.log_softmax(model.join(encoded[:, t], out))[0].numpy()
        walk(t + 1, 0, prefix, log_p + float(log_probs[BLANK_ID]), out, state)
        for symbol in range(model.vocab_size):
            if symbol == BLANK_ID:
                continue
            new_out, new_state = model.predictor.step(tf.constant([symbol]), state)
            ends_frame = emitted + 1 == max_symbols
            walk(t + ends_frame, 0 if ends_frame else emitted + 1, [*prefix, symbol],
                 log_p + float(log_probs[symbol]), new_out, new_state)  # fmt: skip

    out, state = model.predictor.step(tf.constant([BLANK_ID]), model.predictor.initial_state(1))
    walk(0, 0, [], 0.0, out, state)
    return {seq: float(np.logaddexp.reduce(v)) for seq, v in totals.items()}


@pytest.mark.parametrize("blank_bias,max_symbols", [(0.0, 1), (1.0, 1), (0.0, 2)])
def test_wide_beam_finds_the_most_probable_sequence_exactly(blank_bias, max_symbols):
    """With a beam that keeps every candidate of every frame (K >= prefixes x V), merging
    makes modified beam search exact: its best hypothesis is the most probable sequence and
    its score is that sequence's total log-probability over all its alignments (without the
    merge it would be one alignment's)."""
    model = tiny_transducer(vocab_size=3, seed=8, blank_bias=blank_bias)
    feature_frames = 19 if max_symbols == 1 else 15  # -> 4 or 3 encoder frames
    num_frames = encoder_frames(feature_frames)
    feats = random_features([feature_frames], seed=3)[0]
    exact = brute_force(model, feats, max_symbols)
    best_sequence = max(exact, key=exact.get)
    # K >= distinct (sequence, finished) states x candidates per state: nothing is pruned.
    found = beam_decode(
        model, feats[None], [feature_frames], beam=256, max_symbols_per_step=max_symbols
    )
    found = found[0]
    assert 0 < len(best_sequence) < num_frames * max_symbols  # several alignments: merges matter
    assert tuple(found.tokens) == best_sequence
    assert found.score == pytest.approx(exact[best_sequence], abs=1e-4)
    greedy = greedy_decode(model, feats[None], [feature_frames], max_symbols_per_step=max_symbols)[
        0
    ]
    assert found.score >= exact[tuple(greedy.tokens)] - 1e-5
