"""The transducer lattice shared by every loss: its recursion and its posteriors.

A lattice of an utterance is T frames x (U+1) label positions; each cell has a blank edge
(to the next frame) and a label edge (to the next label position). The forward (alpha) and
backward (beta) variables are computed along anti-diagonals t + u = n, so each of the
T + U sequential steps is one vectorised log-add-exp over [B, U+1]; the lattice is skewed
into that diagonal layout once with a pad-and-reshape trick (no gathers, XLA friendly).
Invalid cells hold `LOG_ZERO`, a large negative finite number, so log-add-exp never sees
inf - inf and no NaN can leak from padding.

The full, fused and pruned losses all build their blank and label log-probs [B, T, U+1]
(or [B, T, S] for a band) and hand them to `forward_backward`; their gradients start from
`posteriors`.
"""

from __future__ import annotations

from typing import NamedTuple

import tensorflow as tf

# "log of zero" for lattice cells outside an utterance; finite so that inf - inf never occurs.
LOG_ZERO = -1.0e30


def skew(x: tf.Tensor, fill: float) -> tf.Tensor:
    """[B, T, U1] -> [T+U1-1, B, U1] with out[n, b, u] = x[b, n-u, u] (else `fill`).

    Row u of x^T is shifted right by u by padding each row to width W+1 (W = T+U1-1)
    and re-reading the flat buffer with row width W.
    """
    shape = tf.shape(x)
    batch, frames, u1 = shape[0], shape[1], shape[2]
    width = frames + u1 - 1
    rows = tf.pad(tf.transpose(x, [0, 2, 1]), [[0, 0], [0, 0], [0, u1]], constant_values=fill)
    flat = tf.reshape(rows, [batch, u1 * (width + 1)])[:, : u1 * width]
    return tf.transpose(tf.reshape(flat, [batch, u1, width]), [2, 0, 1])


def unskew(d: tf.Tensor, frames: tf.Tensor) -> tf.Tensor:
    """Inverse of `skew`: [T+U1-1, B, U1] -> [B, T, U1]."""
    shape = tf.shape(d)
    width, batch, u1 = shape[0], shape[1], shape[2]
    flat = tf.reshape(tf.transpose(d, [1, 2, 0]), [batch, u1 * width])
    rows = tf.reshape(tf.pad(flat, [[0, 0], [0, u1]]), [batch, u1, width + 1])[:, :, :frames]
    return tf.transpose(rows, [0, 2, 1])


def log_add(a: tf.Tensor, b: tf.Tensor) -> tf.Tensor:
    big = tf.maximum(a, b)
    return tf.maximum(big + tf.math.log1p(tf.exp(-tf.abs(a - b))), LOG_ZERO)


def shift_up(x: tf.Tensor) -> tf.Tensor:
    """x[..., u] -> x[..., u-1] (index 0 gets log-zero)."""
    fill = tf.fill(tf.concat([tf.shape(x)[:-1], [1]], 0), LOG_ZERO)
    return tf.concat([fill, x[..., :-1]], axis=-1)


def shift_down(x: tf.Tensor) -> tf.Tensor:
    """x[..., u] -> x[..., u+1] (last index gets log-zero)."""
    fill = tf.fill(tf.concat([tf.shape(x)[:-1], [1]], 0), LOG_ZERO)
    return tf.concat([x[..., 1:], fill], axis=-1)


def next_labels(labels, label_lengths, u1):
    """[B, U+1]: the label each lattice row u emits next (0 where there is none)."""
    label_valid = tf.range(u1 - 1)[None, :] < label_lengths[:, None]  # [B, U]
    return tf.pad(tf.where(label_valid, labels, 0), [[0, 0], [0, 1]])


def mask_emissions(log_blank, log_label, logit_lengths, label_lengths, delay_penalty=0.0):
    """Blank and next-label log-probs [B, T, U+1], log-zero outside each lattice.

    `delay_penalty` λ > 0 (k2/icefall's delay-penalized transducer): a label emitted at
    frame t scores λ · ((T_b − 1) / 2 − t) more, so the loss prefers alignments that
    emit earlier; summed over a path it is zero for emissions spread evenly around the
    utterance's middle."""
    shape = tf.shape(log_blank)
    frames, u1 = shape[1], shape[2]
    if delay_penalty:
        centre = (tf.cast(logit_lengths, tf.float32)[:, None] - 1.0) / 2.0  # [B, 1]
        early = centre - tf.cast(tf.range(frames), tf.float32)[None, :]  # [B, T]
        log_label = log_label + float(delay_penalty) * early[:, :, None]
    t_valid = tf.range(frames)[None, :] < logit_lengths[:, None]  # [B, T]
    u_valid = tf.range(u1)[None, :] <= label_lengths[:, None]  # [B, U+1]
    node_valid = t_valid[:, :, None] & u_valid[:, None, :]
    edge_valid = t_valid[:, :, None] & (tf.range(u1)[None, :] < label_lengths[:, None])[:, None]
    return tf.where(node_valid, log_blank, LOG_ZERO), tf.where(edge_valid, log_label, LOG_ZERO)


def forward_backward(log_blank, log_label, logit_lengths, label_lengths):
    """Alpha, beta (diagonal layout [T+U, B, U+1]), terminal mask and log P(y|x) [B]."""
    blank_d = skew(log_blank, LOG_ZERO)
    label_d = skew(log_label, LOG_ZERO)
    width, batch, u1 = tf.shape(blank_d)[0], tf.shape(blank_d)[1], tf.shape(blank_d)[2]

    alpha0 = tf.concat([tf.zeros([batch, 1]), tf.fill([batch, u1 - 1], LOG_ZERO)], axis=1)

    def alpha_step(prev, elems):
        prev_blank, prev_label = elems
        return log_add(prev + prev_blank, shift_up(prev + prev_label))

    if blank_d.shape[0] == 1:  # T = 1 and U = 0: XLA cannot compile a scan over nothing
        alpha = alpha0[None]
    else:
        alpha_rest = tf.scan(alpha_step, (blank_d[:-1], label_d[:-1]), initializer=alpha0)
        alpha = tf.concat([alpha0[None], alpha_rest], axis=0)

    final_diag = logit_lengths - 1 + label_lengths  # [B]
    terminal = tf.logical_and(
        tf.range(width)[:, None, None] == final_diag[None, :, None],
        tf.range(u1)[None, None, :] == label_lengths[None, :, None],
    )  # [T+U, B, U+1]

    def beta_step(nxt, elems):
        blank_n, label_n, term_n = elems
        beta = log_add(nxt + blank_n, shift_down(nxt) + label_n)
        return tf.where(term_n, blank_n, beta)

    beta = tf.scan(
        beta_step,
        (blank_d, label_d, terminal),
        initializer=tf.fill([batch, u1], LOG_ZERO),
        reverse=True,
    )
    index = tf.stack([final_diag, tf.range(batch), label_lengths], axis=1)
    log_prob = tf.gather_nd(alpha, index) + tf.gather_nd(blank_d, index)
    return alpha, beta, blank_d, label_d, terminal, log_prob


class Lattice(NamedTuple):
    """What the forward pass keeps for the backward pass (all small: no V axis)."""

    log_prob: tf.Tensor  # [B]
    lse: tf.Tensor | None  # [B, T, U+1] log-sum-exp over V (fused only)
    next_label: tf.Tensor  # [B, U+1]
    alpha: tf.Tensor  # [T+U, B, U+1] diagonal layout
    beta: tf.Tensor  # [T+U, B, U+1]
    blank_d: tf.Tensor  # [T+U, B, U+1]
    label_d: tf.Tensor  # [T+U, B, U+1]
    terminal: tf.Tensor  # [T+U, B, U+1] bool


def posteriors(saved: Lattice, upstream, frames, label_scale: float = 1.0):
    """upstream_b · the posterior of every blank and label edge, [B, T, U+1] each; the label
    edges' times `label_scale` (FastEmit's 1 + λ)."""
    upstream = tf.cast(upstream, tf.float32)
    beta_next = tf.concat([saved.beta[1:], tf.fill(tf.shape(saved.beta[:1]), LOG_ZERO)], axis=0)
    # Fold |upstream| into the exponent so scaling costs no extra [B,T,U+1] pass.
    norm = (saved.log_prob - tf.math.log(tf.abs(upstream)))[None, :, None]
    sign = tf.sign(upstream)[:, None, None]  # [B, 1, 1]
    alpha = saved.alpha
    post_blank = tf.exp(alpha + saved.blank_d + tf.where(saved.terminal, 0.0, beta_next) - norm)
    post_label = tf.exp(alpha + saved.label_d + shift_down(beta_next) - norm)
    if label_scale != 1.0:
        post_label = post_label * label_scale
    return unskew(post_blank, frames) * sign, unskew(post_label, frames) * sign
