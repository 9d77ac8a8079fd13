"""Greedy CTC search against a NumPy rule: each frame's best symbol, repeats merged, blanks
removed, within each row's length; tokens at the first frame of their run."""

import numpy as np
import pytest
import tensorflow as tf

from asrkit.decoding.search.ctc_greedy import ctc_greedy_search


class _Head:
    """Stands for a hybrid network: its CTC logits are given."""

    def __init__(self, logits):
        self.logits = tf.constant(logits)

    def ctc_logits(self, encoded):
        return self.logits


def _reference(logits, lengths):
    log_probs = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    out = []
    for row, n in zip(log_probs, lengths, strict=True):
        best = row[:n].argmax(-1)
        tokens, frames, previous = [], [], 0
        for t, symbol in enumerate(best):
            if symbol != 0 and symbol != previous:
                tokens.append(int(symbol))
                frames.append(t)
            previous = symbol
        out.append((tokens, frames, float(row[:n].max(-1).sum()), row[frames, tokens]))
    return out


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_ctc_greedy_merges_repeats_and_drops_blanks(seed):
    rng = np.random.default_rng(seed)
    batch, frames, vocab = 4, 30, 5
    # Few symbols and a strong best one per frame: runs, repeats across a blank, blanks.
    path = rng.integers(0, 3, (batch, frames))
    logits = (rng.standard_normal((batch, frames, vocab)) + 4 * np.eye(vocab)[path]).astype(
        np.float32
    )
    lengths = np.array([30, 17, 1, 0])
    found = ctc_greedy_search(_Head(logits), None, tf.constant(lengths))
    for row, (tokens, at, score, token_log_probs) in enumerate(_reference(logits, lengths)):
        n = int(found.counts[row])
        assert found.tokens[row, :n].numpy().tolist() == tokens
        assert found.frames[row, :n].numpy().tolist() == at
        assert np.all(found.tokens[row, n:].numpy() == -1)
        np.testing.assert_allclose(found.token_log_probs[row, :n], token_log_probs, rtol=1e-5)
        assert float(found.scores[row]) == pytest.approx(score, rel=1e-5, abs=1e-6)
    assert int(found.counts[3]) == 0
