"""The auxiliary CTC loss against the enumeration of every frame-level path, its gradient
against finite differences, padding, and the utterances CTC cannot align."""

import itertools

import numpy as np
import pytest
import tensorflow as tf

from asrkit.losses import ctc_losses
from asrkit.losses.ctc import ctc_frames_needed


def log_softmax(x):
    x = x - x.max(axis=-1, keepdims=True)
    return x - np.log(np.exp(x).sum(axis=-1, keepdims=True))


def collapse(path, blank):
    out, previous = [], None
    for symbol in path:
        if symbol != previous and symbol != blank:
            out.append(symbol)
        previous = symbol
    return out


def brute_force(logits, labels, frames, blank):
    """−log Σ over every path of `frames` symbols that collapses to `labels`."""
    logp = log_softmax(logits[:frames].astype(np.float64))
    vocab = logits.shape[-1]
    scores = [
        sum(logp[t, s] for t, s in enumerate(path))
        for path in itertools.product(range(vocab), repeat=frames)
        if collapse(path, blank) == list(labels)
    ]
    return -np.logaddexp.reduce(scores) if scores else np.inf


def case(rng, batch=4, frames=5, max_u=3, vocab=4):
    logits = rng.normal(size=(batch, frames, vocab)).astype(np.float32) * 2
    logit_lengths = rng.integers(2, frames + 1, size=batch).astype(np.int32)
    label_lengths = rng.integers(0, max_u + 1, size=batch).astype(np.int32)
    labels = rng.integers(1, vocab, size=(batch, max_u)).astype(np.int32)
    labels[np.arange(max_u)[None, :] >= label_lengths[:, None]] = 0
    return logits, labels, logit_lengths, label_lengths


@pytest.mark.parametrize("seed", range(3))
def test_ctc_loss_matches_the_enumeration_and_drops_what_cannot_align(seed):
    rng = np.random.default_rng(seed)
    logits, labels, logit_lengths, label_lengths = case(rng)
    labels[0, :2] = 2  # a repeat: needs a blank between
    label_lengths[0] = max(label_lengths[0], 2)
    losses = ctc_losses(logits, labels, logit_lengths, label_lengths, blank=0).numpy()
    for b in range(len(losses)):
        expected = brute_force(logits[b], labels[b, : label_lengths[b]], logit_lengths[b], 0)
        if np.isinf(expected):  # no path: the utterance adds nothing
            assert losses[b] == 0
        else:
            np.testing.assert_allclose(losses[b], expected, rtol=1e-5)


def test_frames_needed_count_the_blank_between_repeats():
    labels = np.array([[1, 1, 2, 2, 0], [3, 1, 3, 3, 3], [1, 2, 3, 4, 4]], np.int32)
    lengths = np.array([4, 5, 3], np.int32)  # the last row's repeat is padding
    expected = [4 + 2, 5 + 2, 3]
    assert ctc_frames_needed(labels, lengths).numpy().tolist() == expected


def test_gradient_matches_finite_differences_and_ignores_padding():
    rng = np.random.default_rng(4)
    logits, labels, logit_lengths, label_lengths = case(rng, batch=2, frames=4)
    logit_lengths[:] = [4, 3]
    label_lengths[:] = [2, 1]
    labels[0, :2], labels[1, :1] = [1, 3], [2]
    x = tf.Variable(logits)
    with tf.GradientTape() as tape:
        total = tf.reduce_sum(ctc_losses(x, labels, logit_lengths, label_lengths))
    grad = tape.gradient(total, x).numpy()
    assert np.all(grad[1, 3] == 0)  # a padded frame
    eps, b = 1e-3, 0
    for t, v in itertools.product(range(4), range(4)):
        plus, minus = logits[b].copy(), logits[b].copy()
        plus[t, v] += eps
        minus[t, v] -= eps
        numeric = (brute_force(plus, [1, 3], 4, 0) - brute_force(minus, [1, 3], 4, 0)) / (2 * eps)
        np.testing.assert_allclose(grad[b, t, v], numeric, atol=2e-3)


def test_an_utterance_that_cannot_align_is_finite_with_no_gradient():
    logits = np.random.default_rng(1).normal(size=(2, 3, 4)).astype(np.float32)
    labels = np.array([[1, 1, 2], [1, 2, 0]], np.int32)  # row 0 needs 4 frames, has 3
    lengths, label_lengths = np.array([3, 3], np.int32), np.array([3, 2], np.int32)
    x = tf.Variable(logits)
    with tf.GradientTape() as tape:
        losses = ctc_losses(x, labels, lengths, label_lengths)
        total = tf.reduce_sum(losses)
    grad = tape.gradient(total, x).numpy()
    assert losses.numpy()[0] == 0 and np.isfinite(losses.numpy()[1]) and losses.numpy()[1] > 0
    assert np.all(grad[0] == 0) and np.all(np.isfinite(grad)) and np.any(grad[1] != 0)
