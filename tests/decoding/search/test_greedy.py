"""Greedy decoding: batched graph search == a plain per-utterance Python loop."""

import numpy as np
import pytest
import tensorflow as tf

from asrkit.decoding import greedy_decode
from asrkit.decoding.search.greedy import greedy_search
from asrkit.tokenizer import BLANK_ID
from tests.decoding.scripted import ScriptedTransducer


def reference_greedy(model, features, max_symbols):
    """The textbook loop, one utterance, eager, no batching tricks."""
    encoded, lengths = model.encode(features[None], tf.constant([len(features)]))
    state = model.predictor.initial_state(1)
    out, state = model.predictor.step(tf.constant([BLANK_ID]), state)
    tokens, frames, score = [], [], 0.0
    for t in range(int(lengths[0])):
        for _ in range(max_symbols):
            log_probs = tf.nn.log_softmax(model.join(encoded[:, t], out))[0].numpy()
            best = int(np.argmax(log_probs))
            score += float(log_probs[best])
            if best == BLANK_ID:
                break
            tokens.append(best)
            frames.append(t)
            out, state = model.predictor.step(tf.constant([best]), state)
    return tokens, frames, score


@pytest.mark.parametrize("max_symbols", [1, 3])
def test_batched_greedy_equals_one_by_one_reference(model, max_symbols):
    rng = np.random.default_rng(0)
    lengths = [60, 37, 21, 9]
    feats = np.zeros((4, 60, 80), np.float32)
    for b, n in enumerate(lengths):
        feats[b, :n] = rng.standard_normal((n, 80))
    hyps = greedy_decode(model, feats, lengths, max_symbols_per_step=max_symbols)
    emitted = 0
    for b, n in enumerate(lengths):
        tokens, frames, score = reference_greedy(model, feats[b, :n], max_symbols)
        assert hyps[b].tokens == tokens
        assert hyps[b].frames == frames
        assert hyps[b].score == pytest.approx(score, rel=1e-4, abs=1e-3)
        emitted += len(tokens)
        assert all(t != BLANK_ID for t in tokens)
        if frames:
            assert max(np.bincount(frames)) <= max_symbols
    assert emitted > 0


def scripted_reference(table, length, max_symbols):
    tokens, frames, score, count = [], [], 0.0, 0
    for t in range(length):
        for _ in range(max_symbols):
            logit = table[t, count]
            score += -np.log1p(np.exp(-abs(logit)))  # the chosen symbol's log-posterior
            if logit < 0:
                break
            tokens.append(1)
            frames.append(t)
            count += 1
    return tokens, frames, score


@pytest.mark.parametrize("window", [1, 3, 8])
@pytest.mark.parametrize("max_symbols", [1, 2, 3])
def test_any_window_takes_the_frame_by_frame_decisions(window, max_symbols):
    """The search looks `window` frames ahead for the next symbol: on random decision
    tables (blank runs longer and shorter than the window, one or several symbols at a
    frame) every window size takes the decisions of the frame-by-frame reference."""
    rng = np.random.default_rng(window * 10 + max_symbols)
    lengths, frames = [40, 27, 11, 1, 0, 33], 40
    slots = frames * max_symbols + 1
    tables = np.where(rng.random((len(lengths), frames, slots)) < 0.35, 1.0, -1.0)
    tables[0, 5:25] = -1.0  # a blank run beyond any window
    found = greedy_search(
        ScriptedTransducer(slots), tf.constant(tables, tf.float32), tf.constant(lengths),
        max_symbols, window=window,
    )  # fmt: skip
    per_frame = []
    for b, n in enumerate(lengths):
        tokens, token_frames, score = scripted_reference(tables[b], n, max_symbols)
        count = int(found.counts[b])
        assert found.tokens[b, :count].numpy().tolist() == tokens
        assert found.frames[b, :count].numpy().tolist() == token_frames
        assert float(found.scores[b]) == pytest.approx(score, rel=1e-5, abs=1e-4)
        per_frame += np.bincount(token_frames, minlength=n).tolist()
    assert set(per_frame) == set(range(max_symbols + 1))  # every count of symbols at a frame
