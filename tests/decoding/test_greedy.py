"""Greedy decoding: batched graph search == a plain per-utterance Python loop."""

import numpy as np
import pytest
import tensorflow as tf

from asrkit.decoding import greedy_decode
from asrkit.tokenizer import BLANK_ID


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
