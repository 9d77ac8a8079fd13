"""Pruned RNN-T (Kuang et al. 2022, as in k2/icefall), written for TensorFlow.

Two losses per utterance:

* the *simple* loss: the RNN-T loss of a trivial joiner, logits = am[t] + lm[u] with am
  [B, T, V] and lm [B, U+1, V] linear projections of the encoder and predictor outputs.
  Its normaliser over V is one matmul (exp(am) · exp(lm)ᵀ), so the whole lattice costs
  O(B·T·(U+1)) memory, and it can be smoothed towards LM-only and AM-only (unigram LM)
  log-probabilities (`lm_only_scale`, `am_only_scale`). Its edge posteriors say where
  the alignment lies;
* the *pruned* loss: the full joint evaluated only on a band of S symbols per frame,
  [B, T, S, V], starting at `s_begin[b, t]` — chosen where the simple loss's occupancy
  is largest, then made monotone, gap-free (it never advances by S or more between
  frames) and anchored at u = 0 on the first frame and at U_b on the last. The band's
  log-probs (whole, or chunk by chunk without the band's logits: `band_log_probs`) are
  placed into the usual [B, T, U+1] lattice (log-zero elsewhere) and the
  same alpha/beta recursion as `rnnt_loss` runs on it.

With S >= U + 1 the band covers the whole lattice and the pruned loss *is* the full loss.
"""

from __future__ import annotations

import functools

import tensorflow as tf

from asrkit.losses.band import band_log_probs
from asrkit.losses.cells import ACTIVATIONS, cells_matmul
from asrkit.losses.chunks import DEFAULT_CHUNK_BYTES
from asrkit.losses.lattice import (
    LOG_ZERO,
    Lattice,
    forward_backward,
    mask_emissions,
    next_labels,
    posteriors,
)
from asrkit.losses.trivial import TINY, plain_terms, trivial_terms


def lattice_loss(log_blank, log_label, logit_lengths, label_lengths):
    """−log P(y|x) [B] from blank and next-label log-probs [B, T, U+1] (any values outside
    each utterance's lattice are ignored), and the node occupancy [B, T, U+1] (the
    posterior of passing through each node; no gradient). Differentiable in both inputs:
    d loss / d log_blank = −posterior of that blank edge (likewise for labels)."""
    log_blank, log_label = mask_emissions(
        tf.cast(log_blank, tf.float32), tf.cast(log_label, tf.float32), logit_lengths,
        label_lengths,
    )  # fmt: skip
    frames = tf.shape(log_blank)[1]

    @tf.custom_gradient
    def core(log_blank, log_label):
        alpha, beta, blank_d, label_d, terminal, log_prob = forward_backward(
            tf.stop_gradient(log_blank), tf.stop_gradient(log_label), logit_lengths,
            label_lengths,
        )  # fmt: skip
        saved = Lattice(log_prob, None, None, alpha, beta, blank_d, label_d, terminal)
        post_blank, post_label = posteriors(saved, tf.ones_like(log_prob), frames)

        def grad(upstream, _occupancy_upstream):
            scale = tf.cast(upstream, tf.float32)[:, None, None]
            return -post_blank * scale, -post_label * scale

        return (-log_prob, post_blank + post_label), grad

    losses, occupancy = core(log_blank, log_label)
    return losses, tf.stop_gradient(occupancy)


def simple_loss(
    am,
    lm,
    labels,
    logit_lengths,
    label_lengths,
    *,
    blank: int = 0,
    lm_only_scale: float = 0.0,
    am_only_scale: float = 0.0,
):
    """The trivial joiner's RNN-T loss [B] and its node occupancy [B, T, U+1].

    am: [B, T, V] encoder part, lm: [B, U+1, V] predictor part of the logits am + lm.
    With both scales 0 this equals `rnnt_loss(am[:, :, None] + lm[:, None], ...)`.
    """
    return _simple_loss(
        functools.partial(plain_terms, am), lm, labels, logit_lengths, label_lengths, blank,
        lm_only_scale, am_only_scale,
    )  # fmt: skip


def fused_simple_loss(
    encoded,
    lm,
    labels,
    logit_lengths,
    label_lengths,
    *,
    kernel,
    bias,
    blank: int = 0,
    lm_only_scale: float = 0.0,
    am_only_scale: float = 0.0,
    chunk_bytes: int = DEFAULT_CHUNK_BYTES,
):
    """`simple_loss` with am = encoded @ kernel + bias computed chunk by chunk, never whole
    (`asrkit.losses.trivial`): the same loss, occupancy and gradients (tested)."""

    def terms(lm, next_label, blank, unigram):
        return trivial_terms(encoded, lm, next_label, kernel=kernel, bias=bias, blank=blank,
                             unigram=unigram, chunk_bytes=chunk_bytes)  # fmt: skip

    return _simple_loss(
        terms, lm, labels, logit_lengths, label_lengths, blank, lm_only_scale, am_only_scale
    )


def _simple_loss(terms, lm, labels, logit_lengths, label_lengths, blank, lm_only_scale,
                 am_only_scale):  # fmt: skip
    """The simple loss from `terms(lm, next_label, blank, unigram)` -> `Terms`: what it
    needs of the encoder and predictor parts (`asrkit.losses.trivial`)."""
    lm = tf.cast(lm, tf.float32)
    labels = tf.cast(labels, tf.int32)
    logit_lengths = tf.cast(logit_lengths, tf.int32)
    label_lengths = tf.cast(label_lengths, tf.int32)
    next_label = next_labels(labels, label_lengths, tf.shape(lm)[1])  # [B, U+1]
    unigram = None
    if am_only_scale:
        # "AM only": the predictor replaced by its unigram average over the batch's rows.
        lm_max = tf.stop_gradient(tf.reduce_max(lm, axis=-1, keepdims=True))  # [B, U+1, 1]
        lm_exp = tf.exp(lm - lm_max)
        rows = tf.sequence_mask(label_lengths + 1, tf.shape(lm)[1], tf.float32)  # [B, U+1]
        lm_probs = lm_exp / tf.reduce_sum(lm_exp, axis=-1, keepdims=True)
        unigram = tf.reduce_sum(lm_probs * rows[..., None], axis=[0, 1])
        unigram = unigram / tf.maximum(tf.reduce_sum(rows), 1.0) + TINY  # [V]
    t = terms(lm, next_label, blank, unigram)

    log_blank = t.am_blank[:, :, None] + t.lm_blank[:, None, :] - t.norm
    log_label = t.am_label + t.lm_label[:, None, :] - t.norm

    combined = 1.0 - lm_only_scale - am_only_scale
    if lm_only_scale or am_only_scale:
        log_blank, log_label = log_blank * combined, log_label * combined
    if lm_only_scale:
        log_blank += lm_only_scale * (t.lm_blank - t.lm_norm)[:, None, :]
        log_label += lm_only_scale * (t.lm_label - t.lm_norm)[:, None, :]
    if am_only_scale:
        log_unigram = tf.math.log(unigram)
        log_blank += am_only_scale * (t.am_blank + log_unigram[blank] - t.am_norm)[:, :, None]
        am_only_label = t.am_label + tf.gather(log_unigram, next_label)[:, None, :]
        log_label += am_only_scale * (am_only_label - t.am_norm[:, :, None])
    return lattice_loss(log_blank, log_label, logit_lengths, label_lengths)


def prune_ranges(occupancy, logit_lengths, label_lengths, *, prune_range: int):
    """s_begin [B, T] int32: the first lattice row of each frame's band of `prune_range`.

    The band maximises the occupancy it covers, then is adjusted so that it is monotone,
    never skips a row between frames (s_begin[t+1] - s_begin[t] <= S - 1), starts at row 0
    on the first frame and contains row U_b from the last real frame on.
    """
    occupancy = tf.cast(occupancy, tf.float32)
    logit_lengths = tf.cast(logit_lengths, tf.int32)
    label_lengths = tf.cast(label_lengths, tf.int32)
    shape = tf.shape(occupancy)
    frames, u1 = shape[1], shape[2]
    span = tf.minimum(prune_range, u1)
    cumulative = tf.pad(tf.cumsum(occupancy, axis=2), [[0, 0], [0, 0], [1, 0]])
    windows = cumulative[:, :, span:] - cumulative[:, :, :-span]  # [B, T, U+2-S]
    s_begin = tf.cast(tf.argmax(windows, axis=2), tf.int32)
    # From the last real frame on: the band that ends at row U_b.
    last = tf.maximum(label_lengths + 1 - span, 0)[:, None]  # [B, 1]
    final = tf.range(frames)[None, :] >= (logit_lengths - 1)[:, None]
    s_begin = tf.where(final, last, s_begin)
    s_begin = _suffix_min(s_begin)  # monotone
    steps = (span - 1) * tf.range(frames)[None, :]
    s_begin = steps - tf.maximum(_suffix_min(steps - s_begin), 0)  # no gap; row 0 first
    return tf.minimum(s_begin, last)


def _suffix_min(x):
    """x[b, t] -> min(x[b, t:]): the largest non-decreasing sequence below x (over a
    [T, T] mask: O(B·T²) integers, one vectorised op, no loop)."""
    frames = tf.shape(x)[1]
    later = tf.range(frames)[None, :] >= tf.range(frames)[:, None]  # [t, k]: k >= t
    return tf.reduce_min(tf.where(later[None], x[:, None, :], x.dtype.max), axis=2)


def pruned_loss(
    encoder_hidden,
    predictor_hidden,
    labels,
    logit_lengths,
    label_lengths,
    *,
    s_begin,
    prune_range: int,
    kernel,
    bias,
    blank: int = 0,
    activation: str = "tanh",
):
    """The RNN-T loss [B] of the joint `act(enc + pred) @ kernel + bias` evaluated only on
    each frame's band of `prune_range` predictor rows starting at `s_begin` [B, T].

    encoder_hidden: [B, T, H] and predictor_hidden: [B, U+1, H] (the joint's projections);
    kernel [H, V], bias [V]: the joint's output layer. Holds the band's whole
    [B, T, S, V] log-softmax; `fused_pruned_loss` does not."""

    def band(rows, band_labels):
        pred_band = tf.gather(predictor_hidden, rows, axis=1, batch_dims=1)  # [B, T, S, H]
        hidden = ACTIVATIONS[activation][0](encoder_hidden[:, :, None, :] + pred_band)
        dtype = hidden.dtype
        logits = cells_matmul(hidden, tf.cast(kernel, dtype)) + tf.cast(bias, dtype)
        log_probs = tf.nn.log_softmax(tf.cast(logits, tf.float32), axis=-1)
        picked = tf.gather(log_probs, band_labels[..., None], axis=3, batch_dims=3)[..., 0]
        return log_probs[..., blank], picked

    return _band_loss(band, predictor_hidden, labels, logit_lengths, label_lengths, s_begin,
                      prune_range)  # fmt: skip


def fused_pruned_loss(
    encoder_hidden,
    predictor_hidden,
    labels,
    logit_lengths,
    label_lengths,
    *,
    s_begin,
    prune_range: int,
    kernel,
    bias,
    blank: int = 0,
    chunk_bytes: int = DEFAULT_CHUNK_BYTES,
    activation: str = "tanh",
):
    """`pruned_loss` with the band's log-probs chunk by chunk (`band_log_probs`, about
    `chunk_bytes` of temporaries) instead of its whole [B, T, S, V] log-softmax; the same
    loss and gradients (tested)."""

    def band(rows, band_labels):
        return band_log_probs(
            encoder_hidden, predictor_hidden, rows, band_labels, kernel=kernel, bias=bias,
            blank=blank, chunk_bytes=chunk_bytes, activation=activation,
        )  # fmt: skip

    return _band_loss(band, predictor_hidden, labels, logit_lengths, label_lengths, s_begin,
                      prune_range)  # fmt: skip


def _band_loss(band, predictor_hidden, labels, logit_lengths, label_lengths, s_begin,
               prune_range):  # fmt: skip
    """The lattice loss of the band's (log_blank, log_label) [B, T, S] from
    `band(rows [B, T, S], band_labels [B, T, S])`, every cell outside the band impossible."""
    labels = tf.cast(labels, tf.int32)
    u1 = tf.shape(predictor_hidden)[1]
    span = tf.minimum(prune_range, u1)
    rows = tf.minimum(s_begin[:, :, None] + tf.range(span)[None, None, :], u1 - 1)  # [B,T,S]
    next_label = next_labels(labels, tf.cast(label_lengths, tf.int32), u1)  # [B, U+1]
    band_labels = tf.gather(next_label, rows, axis=1, batch_dims=1)  # [B, T, S]
    band_blank, band_label = band(rows, band_labels)
    # Into the [B, T, U+1] lattice: row u of frame t holds band column u - s_begin[t].
    column = tf.range(u1)[None, None, :] - s_begin[:, :, None]  # [B, T, U+1]
    inside = (column >= 0) & (column < span)
    column = tf.clip_by_value(column, 0, span - 1)
    full_blank = tf.where(inside, tf.gather(band_blank, column, axis=2, batch_dims=2), LOG_ZERO)
    full_label = tf.where(inside, tf.gather(band_label, column, axis=2, batch_dims=2), LOG_ZERO)
    losses, _ = lattice_loss(full_blank, full_label, logit_lengths, label_lengths)
    return losses


def loss_scales(updates, warmup_updates: int, simple_scale: float):
    """(simple, pruned) loss weights after `updates` optimizer updates (icefall's warm-up):
    the simple loss starts at 1 and falls linearly to `simple_scale`, the pruned loss
    starts at 0.1 and rises to 1, both over `warmup_updates`."""
    if warmup_updates <= 0:
        return tf.constant(simple_scale, tf.float32), tf.constant(1.0, tf.float32)
    progress = tf.minimum(tf.cast(updates, tf.float32) / float(warmup_updates), 1.0)
    return 1.0 - progress * (1.0 - simple_scale), 0.1 + 0.9 * progress
