"""Independent NumPy references for the RNN-T loss (float64, no TensorFlow)."""

import itertools

import numpy as np


def log_softmax(x):
    x = x - x.max(axis=-1, keepdims=True)
    return x - np.log(np.exp(x).sum(axis=-1, keepdims=True))


def brute_force_loss(logits, labels, frames, n_labels, blank, fused=True, delay_penalty=0.0):
    """-log P(y|x) by summing over every alignment (tiny shapes only).

    An alignment is a sequence of T blanks and U labels whose last symbol is a blank;
    walking it visits lattice cells (t, u), emitting blank (t+1) or label (u+1). With
    `delay_penalty` λ, each label emitted at frame t adds λ·((T−1)/2 − t) to the path's score.
    """
    lp = log_softmax(np.asarray(logits, np.float64)) if fused else np.asarray(logits, np.float64)
    y = list(labels[:n_labels])
    total = []
    for label_steps in itertools.combinations(range(frames + n_labels - 1), n_labels):
        t = u = 0
        score = 0.0
        for step in range(frames + n_labels - 1):
            if step in label_steps:
                score += lp[t, u, y[u]] + delay_penalty * ((frames - 1) / 2 - t)
                u += 1
            else:
                score += lp[t, u, blank]
                t += 1
        score += lp[frames - 1, n_labels, blank]  # the final blank leaves the lattice
        total.append(score)
    return -np.logaddexp.reduce(total)


def dp_loss(logits, labels, frames, n_labels, blank, fused=True):
    """-log P(y|x) with the textbook alpha recursion, float64 loops."""
    lp = log_softmax(np.asarray(logits, np.float64)) if fused else np.asarray(logits, np.float64)
    alpha = np.full((frames, n_labels + 1), -np.inf)
    alpha[0, 0] = 0.0
    for t in range(frames):
        for u in range(n_labels + 1):
            if t == 0 and u == 0:
                continue
            a = alpha[t - 1, u] + lp[t - 1, u, blank] if t > 0 else -np.inf
            b = alpha[t, u - 1] + lp[t, u - 1, labels[u - 1]] if u > 0 else -np.inf
            alpha[t, u] = np.logaddexp(a, b)
    return -(alpha[frames - 1, n_labels] + lp[frames - 1, n_labels, blank])
