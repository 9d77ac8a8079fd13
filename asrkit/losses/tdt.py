"""The TDT (token-and-duration transducer) loss: Xu et al. 2023, "Efficient Sequence
Transduction by Jointly Predicting Tokens and Durations" (arXiv 2304.06795), as NeMo
defines it.

The joint gives, at lattice cell (t, u), token logits (blank included) and logits over the
`durations` d_1 .. d_D. An emission at (t, u) with duration d moves to frame t + d: a
blank (d > 0 only) to (t + d, u), the next label to (t + d, u + 1) (d = 0: another label
at the same frame). With token log-probs less `sigma` (logit under-normalisation) and
duration log-probs,

    alpha(0, 0) = 0
    alpha(t, u) = logsumexp over d of
                    alpha(t - d, u) + blank(t - d, u) + dur_d(t - d, u)             [d > 0]
                    alpha(t - d, u - 1) + label(t - d, u - 1) + dur_d(t - d, u - 1)
    log P(y|x)  = logsumexp over d > 0 of
                    alpha(T - d, U) + blank(T - d, U) + dur_d(T - d, U)

so every path ends with a blank landing exactly on frame T. The recursion runs frame by
frame; within a frame the duration-0 label arcs form a linear recurrence along u, solved
in one cumulative log-sum-exp. Its gradient is written out: the beta recursion runs the
frames backwards the same way, and each arc's posterior alpha + arc + beta − log P is its
gradient (the lattice holds no V axis: [B, T, U+1] and [B, T, U+1, D]).

The joint's widest tensors are never held whole: `tdt_cell_log_probs` evaluates the joint
one chunk of frames at a time and keeps, per cell, only the blank and next-label log-probs
and the D duration log-probs; its backward pass recomputes each chunk (as the fused RNN-T
loss does). An utterance no duration sequence can align (e.g. only even durations and an
odd frame count) has loss +inf.
"""

from __future__ import annotations

import functools

import tensorflow as tf

from asrkit.losses.cells import ACTIVATIONS, cells_gradient, cells_matmul, joint_cells, picked
from asrkit.losses.chunks import (
    DEFAULT_CHUNK_BYTES,
    accumulate_chunks,
    in_chunks,
    joint_chunk_frames,
    map_chunks,
    static_or_dynamic,
)
from asrkit.losses.lattice import LOG_ZERO, log_add, next_labels

DEFAULT_DURATIONS = (0, 1, 2, 3, 4)
_MASKED = -1.0e4  # log-prob of cells outside an utterance: finite, so sums stay finite


def tdt_log_prob(log_blank, log_label, log_durations, logit_lengths, label_lengths, durations):
    """log P(y|x) [B] from per-cell log-probs: log_blank, log_label [B, T, U+1] (the
    blank's and the next label's, sigma already subtracted) and log_durations [B, T, U+1,
    D]. Impossible utterances give about LOG_ZERO."""
    durations = [int(d) for d in durations]
    log_blank = tf.cast(log_blank, tf.float32)
    log_label = tf.cast(log_label, tf.float32)
    log_durations = tf.cast(log_durations, tf.float32)
    logit_lengths = tf.cast(logit_lengths, tf.int32)
    label_lengths = tf.cast(label_lengths, tf.int32)
    shape = tf.shape(log_blank)
    frames, u1 = shape[1], shape[2]
    valid = (tf.range(frames)[None, :, None] < logit_lengths[:, None, None]) & (
        tf.range(u1)[None, None, :] <= label_lengths[:, None, None]
    )
    labels_ok = valid & (tf.range(u1)[None, None, :] < label_lengths[:, None, None])
    blank_t = tf.transpose(tf.where(valid, log_blank, _MASKED), [1, 0, 2])  # [T, B, U+1]
    label_t = tf.transpose(tf.where(labels_ok, log_label, _MASKED), [1, 0, 2])
    dur_t = tf.transpose(tf.where(valid[..., None], log_durations, _MASKED), [1, 0, 2, 3])
    return _log_prob(blank_t, label_t, dur_t, logit_lengths, label_lengths, tuple(durations))


def _log_prob(blank_t, label_t, dur_t, logit_lengths, label_lengths, durations):
    """log P(y|x) [B] of the time-major masked log-probs, with its own gradient: the
    posteriors of every arc from alpha and beta (no tape through the frame loop)."""

    @tf.custom_gradient
    def core(blank_t, label_t, dur_t, logit_lengths, label_lengths):
        blank_t, label_t, dur_t = (tf.stop_gradient(x) for x in (blank_t, label_t, dur_t))
        alpha = _alphas(blank_t, label_t, dur_t, durations)  # [T, B, U+1]
        final = _terminal(alpha, blank_t, dur_t, logit_lengths, label_lengths, durations)

        def grad(upstream):
            # copies made in the gradient's graph: inside a tf.cond branch (the omega draw)
            # a graph function cannot capture the forward branch's tensors itself
            here = [tf.identity(x) for x in (blank_t, label_t, dur_t, alpha, final, upstream,
                                             logit_lengths, label_lengths)]  # fmt: skip
            return (*_arc_gradients(*here, durations), None, None)

        return final, grad

    return core(blank_t, label_t, dur_t, logit_lengths, label_lengths)


def _terminal(alpha, blank_t, dur_t, logit_lengths, label_lengths, durations):
    """log P [B]: a last blank from (T_b - d, U_b) landing exactly on frame T_b."""
    batch = tf.shape(alpha)[1]
    rows = tf.range(batch)
    final = tf.fill([batch], LOG_ZERO)
    for k, d in enumerate(durations):
        if d == 0:
            continue
        s = logit_lengths - d
        at = tf.stack([tf.maximum(s, 0), rows, label_lengths], axis=1)
        term = (tf.gather_nd(alpha, at) + tf.gather_nd(blank_t, at)
                + tf.gather_nd(dur_t[..., k], at))  # fmt: skip
        final = tf.where(s >= 0, log_add(final, term), final)
    return final


@functools.partial(tf.function, reduce_retracing=True, autograph=False)
def _arc_gradients(blank_t, label_t, dur_t, alpha, final, upstream, logit_lengths,
                   label_lengths, durations):  # fmt: skip
    """d(Σ_b upstream_b · log P_b) / d(blank_t, label_t, dur_t): each arc's posterior,
    alpha(t, u) + arc + beta(destination) − log P, summed per input. Utterances no
    alignment reaches get zero gradients."""
    frames = tf.shape(alpha)[0]
    beta = _betas(blank_t, label_t, dur_t, logit_lengths, label_lengths, durations)
    possible = final > LOG_ZERO / 2
    scale = tf.where(possible, upstream, 0.0)[None, :, None]  # [1, B, 1]
    base = alpha - tf.where(possible, final, 0.0)[None, :, None]
    g_blank = tf.zeros_like(blank_t)
    g_label = tf.zeros_like(label_t)
    g_dur = []
    frame = tf.range(frames)[:, None, None]
    for k, d in enumerate(durations):
        to = beta[d : d + frames]  # beta(t + d, u) [T, B, U+1]
        to_next = tf.concat([to[:, :, 1:], tf.zeros_like(to[:, :, :1]) + LOG_ZERO], axis=2)
        to_next = tf.where(frame + d == logit_lengths[None, :, None], LOG_ZERO, to_next)
        arc = base + dur_t[..., k]
        p_label = scale * tf.exp(tf.minimum(arc + label_t + to_next, 0.0))
        g_label += p_label
        g = p_label
        if d > 0:
            p_blank = scale * tf.exp(tf.minimum(arc + blank_t + to, 0.0))
            g_blank += p_blank
            g += p_blank
        g_dur.append(g)
    return g_blank, g_label, tf.stack(g_dur, axis=-1)


@functools.partial(tf.function, reduce_retracing=True, autograph=False)
def _betas(blank_t, label_t, dur_t, logit_lengths, label_lengths, durations):
    """beta [T + max(d) + 1, B, U+1]: log of the paths from (t, u) to the end, frames past
    T included (0 at (T_b, U_b), the end; LOG_ZERO elsewhere at and past T_b)."""
    shape = tf.shape(blank_t)
    frames, batch, u1 = shape[0], shape[1], shape[2]
    longest = max(durations)
    position = tf.range(u1)[None, :]
    ends = tf.where(position == label_lengths[:, None], 0.0, LOG_ZERO)  # [B, U+1]
    lengths = logit_lengths[:, None]

    def past(t, row):  # rows at or past the end of their utterance
        return tf.where(t == lengths, ends, tf.where(t > lengths, LOG_ZERO, row))

    def shift_down(x):  # position u receives from u + 1
        return tf.concat([x[:, 1:], tf.zeros_like(x[:, :1]) + LOG_ZERO], axis=1)

    def step(i, recent, betas):  # recent[j] = beta(t + 1 + j)
        t = frames - 1 - i
        arrived = tf.zeros_like(recent[0]) + LOG_ZERO
        for k, d in enumerate(durations):
            if d == 0:
                continue
            b = recent[d - 1]
            blank_arc = blank_t[t] + dur_t[t][..., k] + b
            # a label never lands on the end frame: only a blank ends the utterance
            landing = tf.where(t + d == lengths, LOG_ZERO, shift_down(b))
            label_arc = label_t[t] + dur_t[t][..., k] + landing
            arrived = log_add(arrived, log_add(blank_arc, label_arc))
        if 0 in durations:  # labels at frame t itself: beta(t, u) <- beta(t, u + 1)
            weight = label_t[t] + dur_t[t][..., durations.index(0)]  # [B, U+1]
            offset = tf.concat([tf.zeros_like(weight[:, :1]), tf.cumsum(weight[:, :-1], axis=1)], 1)
            arrived = tf.math.cumulative_logsumexp(arrived + offset, axis=1, reverse=True) - offset
        arrived = past(t, tf.maximum(arrived, LOG_ZERO))
        recent = tf.concat([arrived[None], recent[:-1]], axis=0)
        return i + 1, recent, betas.write(t, arrived)

    tail = tf.stack([past(frames + j, tf.zeros([batch, u1]) + LOG_ZERO)
                     for j in range(longest + 1)])  # fmt: skip  # frames T .. T + max(d)
    betas = tf.TensorArray(tf.float32, size=frames, element_shape=tf.TensorShape([None, None]))
    _, _, betas = tf.while_loop(
        lambda i, *_: i < frames, step, [tf.constant(0), tail[:longest], betas]
    )
    return tf.concat([betas.stack(), tail], axis=0)


# A graph function even for eager callers: a TensorArray in an eager while loop fails in
# TensorFlow 2.21 (see asrkit.losses.fused).
@functools.partial(tf.function, reduce_retracing=True, autograph=False)
def _alphas(blank_t, label_t, dur_t, durations):
    """alpha [T, B, U+1] of the time-major per-cell log-probs."""
    shape = tf.shape(blank_t)
    frames, batch, u1 = shape[0], shape[1], shape[2]
    start = tf.concat([tf.zeros([batch, 1]), tf.fill([batch, u1 - 1], LOG_ZERO)], axis=1)

    def shift_up(x):  # position u receives from u - 1 (no Fill of a run-time shape: XLA)
        return tf.concat([tf.zeros_like(x[:, :1]) + LOG_ZERO, x[:, :-1]], axis=1)

    longest = max(durations)

    def step(t, recent, alphas):  # recent[j] = alpha(t - 1 - j), LOG_ZERO before frame 0
        arrived = tf.zeros_like(recent[0]) + LOG_ZERO
        for k, d in enumerate(durations):
            if d == 0:
                continue
            s = tf.maximum(t - d, 0)
            a = recent[d - 1]
            blank_arc = a + blank_t[s] + dur_t[s][..., k]
            label_arc = shift_up(a + label_t[s] + dur_t[s][..., k])
            arrived = log_add(arrived, log_add(blank_arc, label_arc))
        arrived = tf.where(t == 0, start, tf.maximum(arrived, LOG_ZERO))
        if 0 in durations:  # labels emitted at frame t itself: alpha(t, u) <- alpha(t, u - 1)
            weight = label_t[t] + dur_t[t][..., durations.index(0)]  # [B, U+1]
            offset = tf.concat([tf.zeros_like(weight[:, :1]), tf.cumsum(weight[:, :-1], axis=1)], 1)
            arrived = offset + tf.math.cumulative_logsumexp(arrived - offset, axis=1)
        arrived = tf.maximum(arrived, LOG_ZERO)
        recent = tf.concat([arrived[None], recent[:-1]], axis=0)
        return t + 1, recent, alphas.write(t, arrived)

    recent = tf.fill(tf.stack([longest, batch, u1]), LOG_ZERO)
    alphas = tf.TensorArray(tf.float32, size=frames, element_shape=tf.TensorShape([None, None]))
    _, _, alphas = tf.while_loop(lambda t, *_: t < frames, step, [tf.constant(0), recent, alphas])
    return alphas.stack()


def _losses(log_prob):
    """-log P, +inf where no alignment exists."""
    return tf.where(log_prob < LOG_ZERO / 2, float("inf"), -log_prob)


def tdt_loss(
    token_logits, duration_logits, labels, logit_lengths, label_lengths, *,
    durations=DEFAULT_DURATIONS, blank: int = 0, sigma: float = 0.0,
):  # fmt: skip
    """Per-utterance TDT loss [B] from whole logits: token_logits [B, T, U+1, V],
    duration_logits [B, T, U+1, D] (the reference path; `fused_tdt_loss` never holds them)."""
    labels = tf.cast(labels, tf.int32)
    u1 = tf.shape(token_logits)[2]
    log_probs = tf.nn.log_softmax(tf.cast(token_logits, tf.float32), axis=-1)
    next_label = next_labels(labels, tf.cast(label_lengths, tf.int32), u1)  # [B, U+1]
    index = tf.broadcast_to(next_label[:, None, :], tf.shape(log_probs)[:3])
    log_label = tf.gather(log_probs, index, batch_dims=3)
    log_durations = tf.nn.log_softmax(tf.cast(duration_logits, tf.float32), axis=-1)
    log_prob = tdt_log_prob(
        log_probs[..., blank] - sigma, log_label - sigma, log_durations, logit_lengths,
        label_lengths, durations,
    )  # fmt: skip
    return _losses(log_prob)


def fused_tdt_loss(
    encoder_hidden, predictor_hidden, labels, logit_lengths, label_lengths, *, kernel, bias,
    duration_kernel, duration_bias, durations=DEFAULT_DURATIONS, blank: int = 0,
    sigma: float = 0.0, chunk_bytes: int = DEFAULT_CHUNK_BYTES, activation: str = "tanh",
):  # fmt: skip
    """Per-utterance TDT loss [B] of the joint `act(e + p)` -> (kernel, bias) token logits
    and (duration_kernel, duration_bias) duration logits, chunk by chunk."""
    log_blank, log_label, log_durations = tdt_cell_log_probs(
        encoder_hidden, predictor_hidden, labels, label_lengths, kernel=kernel, bias=bias,
        duration_kernel=duration_kernel, duration_bias=duration_bias, blank=blank,
        chunk_bytes=chunk_bytes, activation=activation,
    )  # fmt: skip
    log_prob = tdt_log_prob(
        log_blank - sigma, log_label - sigma, log_durations, logit_lengths, label_lengths,
        durations,
    )  # fmt: skip
    return _losses(log_prob)


def tdt_cell_log_probs(
    encoder_hidden, predictor_hidden, labels, label_lengths, *, kernel, bias, duration_kernel,
    duration_bias, blank: int = 0, chunk_bytes: int = DEFAULT_CHUNK_BYTES,
    activation: str = "tanh",
):  # fmt: skip
    """(log_blank, log_label [B, T, U+1], log_durations [B, T, U+1, D]) float32 of the
    joint on encoder_hidden [B, T, H] and predictor_hidden [B, U+1, H], one chunk of frames
    at a time; the backward pass recomputes each chunk."""
    dtype = encoder_hidden.dtype
    kernel, bias = tf.cast(kernel, dtype), tf.cast(bias, dtype)
    duration_kernel, duration_bias = tf.cast(duration_kernel, dtype), tf.cast(duration_bias, dtype)
    u1 = tf.shape(predictor_hidden)[1]
    next_label = next_labels(tf.cast(labels, tf.int32), tf.cast(label_lengths, tf.int32), u1)
    width = static_or_dynamic(kernel, 1) + static_or_dynamic(duration_kernel, 1)
    chunk = joint_chunk_frames(
        encoder_hidden, static_or_dynamic(predictor_hidden, 1), static_or_dynamic(kernel, 0),
        width, chunk_bytes,
    )  # fmt: skip
    blank = int(blank)

    @tf.custom_gradient
    def core(enc, pred, kernel, bias, dkernel, dbias):
        enc, pred = tf.stop_gradient(enc), tf.stop_gradient(pred)
        weights = [tf.stop_gradient(w) for w in (kernel, bias, dkernel, dbias)]
        frames = tf.shape(enc)[1]
        enc_c, chunks = in_chunks(enc, chunk)
        lse, log_blank, log_label, log_dur = _forward(
            enc_c, pred, *weights, next_label, blank, chunks, frames, activation
        )

        def grad(g_blank, g_label, g_dur):
            g = [in_chunks(tf.cast(x, tf.float32), chunk)[0] for x in (g_blank, g_label, g_dur)]
            lse_c, _ = in_chunks(lse, chunk)
            d_enc, *rest = _backward(
                enc_c, pred, *weights, next_label, blank, chunks, frames, activation, lse_c, *g
            )
            return (tf.cast(d_enc, enc.dtype), *(tf.cast(d, w.dtype) for d, w in
                    zip(rest, (pred, kernel, bias, dkernel, dbias), strict=True)))  # fmt: skip

        return (log_blank, log_label, log_dur), grad

    return core(encoder_hidden, predictor_hidden, kernel, bias, duration_kernel, duration_bias)


def _chunk(enc_c, pred, kernel, bias, dkernel, dbias, i, activation):
    """Chunk i: hidden [B, C, U+1, H], float32 token logits [B, C, U+1, V] and duration
    logits [B, C, U+1, D]."""
    enc = tf.gather(enc_c, i, axis=1)
    hidden, logits = joint_cells(enc[:, :, None, :] + pred[:, None, :, :], kernel, bias, activation)
    duration_logits = tf.cast(cells_matmul(hidden, dkernel) + dbias, tf.float32)
    return hidden, logits, duration_logits


# Graph functions even for eager callers (see asrkit.losses.fused).
@functools.partial(tf.function, reduce_retracing=True, autograph=False)
def _forward(enc_c, pred, kernel, bias, dkernel, dbias, next_label, blank, chunks, frames,
             activation):  # fmt: skip
    def forward_chunk(i):
        _, logits, duration_logits = _chunk(enc_c, pred, kernel, bias, dkernel, dbias, i,
                                            activation)  # fmt: skip
        index = tf.broadcast_to(next_label[:, None, :], tf.shape(logits)[:3])
        lse, picked_blank, picked_label = picked(logits, index, blank)
        return lse, picked_blank, picked_label, tf.nn.log_softmax(duration_logits, axis=-1)

    return map_chunks(chunks, frames, forward_chunk, 4)


@functools.partial(tf.function, reduce_retracing=True, autograph=False)
def _backward(enc_c, pred, kernel, bias, dkernel, dbias, next_label, blank, chunks, frames,
              activation, lse_c, g_blank_c, g_label_c, g_dur_c):  # fmt: skip
    labels = next_label[:, None, :]  # [B, 1, U+1]
    derivative = ACTIVATIONS[activation][1]

    def backward_chunk(i):
        hidden, logits, duration_logits = _chunk(enc_c, pred, kernel, bias, dkernel, dbias, i,
                                                 activation)  # fmt: skip
        # The upstream gradients are minus the posteriors `cells_gradient` expects.
        d_pre, chunk_kernel, chunk_bias = cells_gradient(
            hidden, logits, tf.gather(lse_c, i, axis=1), -tf.gather(g_blank_c, i, axis=1),
            -tf.gather(g_label_c, i, axis=1), blank, labels, kernel, activation,
        )  # fmt: skip
        g_dur = tf.gather(g_dur_c, i, axis=1)  # [B, C, U+1, D]
        softmax = tf.nn.softmax(duration_logits, axis=-1)
        d_dur = g_dur - softmax * tf.reduce_sum(g_dur, axis=-1, keepdims=True)
        hidden32 = tf.cast(hidden, tf.float32)
        d_pre += cells_matmul(d_dur, tf.cast(dkernel, tf.float32), transpose_w=True) * derivative(
            hidden32
        )
        flat_hidden = tf.reshape(hidden32, [-1, tf.shape(hidden32)[3]])
        flat_d_dur = tf.reshape(d_dur, [-1, tf.shape(d_dur)[3]])
        # d_enc [B, C, H]; the others summed over chunks
        return tf.reduce_sum(d_pre, axis=2), (
            tf.reduce_sum(d_pre, axis=1), chunk_kernel, chunk_bias,
            tf.matmul(flat_hidden, flat_d_dur, transpose_a=True),
            tf.reduce_sum(flat_d_dur, axis=0),
        )  # fmt: skip

    totals = [tf.zeros_like(x, tf.float32) for x in (pred, kernel, bias, dkernel, dbias)]
    d_enc, rest = accumulate_chunks(chunks, frames, backward_chunk, totals)
    return (d_enc, *rest)
