"""TDT greedy search, window by window == NeMo's decision rule applied frame by frame."""

from types import SimpleNamespace

import numpy as np
import pytest
import tensorflow as tf

from asrkit.decoding.search.tdt_greedy import tdt_greedy_search
from tests.decoding.scripted import ScriptedTransducer

SHARP = 5.0  # duration logits: -SHARP (d - chosen)^2


class ScriptedTdt(ScriptedTransducer):
    """The scripted transducer with a second table for durations: encoder frames are
    [tokens table | durations table]; at frame t with n symbols so far the best duration
    is durations[t, n] (an index into `durations`)."""

    def __init__(self, slots, durations):
        super().__init__(slots)
        self.config = SimpleNamespace(durations=durations)

    def predictor_proj(self, predicted):  # the one-hot of n over both tables
        return tf.concat([predicted, predicted], -1)

    def duration_layer(self, hidden):
        picked = tf.reduce_max(hidden[..., self.slots :], -1, keepdims=True)
        return -SHARP * tf.square(tf.range(len(self.config.durations), dtype=tf.float32) - picked)


def log_softmax(x):
    x = np.asarray(x, np.float64)
    return x - x.max() - np.log(np.exp(x - x.max()).sum())


def reference(tokens_table, duration_table, length, durations, max_symbols):
    """NeMo's greedy TDT rule, one decision at a time: a blank moves on by its duration (at
    least one frame); a symbol is emitted and the search moves on by its duration, or by one
    frame after `max_symbols` symbols at one frame with duration 0."""
    tokens, frames, score = [], [], 0.0
    t, count, run, last = 0, 0, 0, -1
    while t < length:
        logit, index = tokens_table[t, count], int(duration_table[t, count])
        score += log_softmax([0.0, logit]).max()
        score += log_softmax(-SHARP * np.square(np.arange(len(durations)) - index)).max()
        skip = durations[index]
        if logit < 0:
            t += max(skip, 1)
            continue
        tokens.append(1)
        frames.append(t)
        count += 1
        run = run + 1 if last == t else 1
        last = t
        t += 1 if skip == 0 and run >= max_symbols else skip
    return tokens, frames, score


@pytest.mark.parametrize("durations", [(0, 1, 2, 3, 4), (0, 2, 5), (1, 3)])
@pytest.mark.parametrize("window", [1, 3, 8])
@pytest.mark.parametrize("max_symbols", [1, 2])
def test_any_window_takes_the_decision_by_decision_path(durations, window, max_symbols):
    """Random decision tables (blank jumps within, across and past the window; symbols
    with duration 0, repeated at a frame up to the limit): every window size finds the
    reference's tokens, frames and score."""
    rng = np.random.default_rng(window * 100 + max_symbols * 10 + len(durations))
    lengths, frames = [40, 27, 11, 1, 0, 33], 40
    slots = frames * max_symbols + 1
    shape = (len(lengths), frames, slots)
    tokens_table = np.where(rng.random(shape) < 0.5, 1.0, -1.0)
    duration_table = rng.integers(0, len(durations), shape).astype(np.float64)
    encoded = tf.constant(np.concatenate([tokens_table, duration_table], -1), tf.float32)
    found = tdt_greedy_search(ScriptedTdt(slots, durations), encoded, tf.constant(lengths),
                              max_symbols, window=window)  # fmt: skip
    emitted = 0
    for b, n in enumerate(lengths):
        want_tokens, want_frames, want_score = reference(
            tokens_table[b], duration_table[b], n, durations, max_symbols
        )
        count = int(found.counts[b])
        assert found.tokens[b, :count].numpy().tolist() == want_tokens, b
        assert found.frames[b, :count].numpy().tolist() == want_frames, b
        assert float(found.scores[b]) == pytest.approx(want_score, rel=1e-5, abs=1e-3), b
        emitted += count
    assert emitted > 10
