"""The pruned loss' trivial joiner, chunk by chunk: what the simple loss needs from the
encoder's projection to the vocabulary, never holding that projection for all frames.

The simple loss (`asrkit.losses.pruned.simple_loss`) reads the encoder part of its logits,
am = encoded @ kernel + bias [B, T, V], and the predictor part lm [B, U+1, V] only through
these reductions over V:

    norm[t, u]     = log Σ_v exp(am[t, v] + lm[u, v])          [B, T, U+1]
    am_label[t, u] = am[t, next_label[u]]                      [B, T, U+1]
    am_blank[t]    = am[t, blank]                              [B, T]
    am_norm[t]     = log Σ_v exp(am[t, v]) · unigram[v]        [B, T] (AM-only smoothing)
    lm_label[u], lm_blank[u], lm_norm[u] = lm[u, next_label[u]], lm[u, blank],
                     log Σ_v exp(lm[u, v])                      [B, U+1] (lm_norm: LM-only)

`trivial_terms` computes them a chunk of frames at a time (am, its exponentials and their
products with exp(lm) exist for one chunk only) and, with a custom gradient, recomputes
each chunk in the backward pass:

    d am[t, v] = exp(am[t, v]) · Σ_u g_norm[t, u] · exp(lm[u, v] − norm[t, u])
               + Σ_u g_label[t, u] · [v = next_label[u]] + g_blank[t] · [v = blank]
               + g_am_norm[t] · exp(am[t, v]) · unigram[v] / exp(am_norm[t])
    d lm[u, v] = exp(lm[u, v]) · Σ_t g_norm[t, u] · exp(am[t, v] − norm[t, u])
               + g_lm_norm[u] · exp(lm[u, v] − lm_norm[u])
               + g_lm_label[u] · [v = next_label[u]] + g_lm_blank[u] · [v = blank]
    d unigram[v] = Σ_t g_am_norm[t] · exp(am[t, v] − am_norm[t])

then through the projection to the encoder frames, the kernel and the bias. d lm is formed
once, after the chunks, as one [B, U+1, V] tensor (the picks' gradients added where they
fall, not as one-hot products of that size). (Exponentials are taken after subtracting
each frame's and each row's maximum, as the plain path does.)
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import tensorflow as tf

from asrkit.losses.cells import add_at_last
from asrkit.losses.chunks import (
    DEFAULT_CHUNK_BYTES,
    accumulate_chunks,
    in_chunks,
    joint_chunk_frames,
    map_chunks,
    static_or_dynamic,
)

TINY = tf.experimental.numpy.finfo(tf.float32.as_numpy_dtype).tiny


class Terms(NamedTuple):
    """What the simple loss needs of its logits am + lm (see the module docstring)."""

    norm: tf.Tensor  # [B, T, U+1]
    am_label: tf.Tensor  # [B, T, U+1]
    am_blank: tf.Tensor  # [B, T]
    am_norm: tf.Tensor | None  # [B, T], with a unigram only
    lm_label: tf.Tensor  # [B, U+1]
    lm_blank: tf.Tensor  # [B, U+1]
    lm_norm: tf.Tensor  # [B, U+1]


def plain_terms(am, lm, next_label, blank: int, unigram=None) -> Terms:
    """The reductions from a whole am [B, T, V] (differentiated by TensorFlow)."""
    am, lm = tf.cast(am, tf.float32), tf.cast(lm, tf.float32)
    next_label = tf.cast(next_label, tf.int32)
    am_max = tf.stop_gradient(tf.reduce_max(am, axis=-1, keepdims=True))  # [B, T, 1]
    lm_max = tf.stop_gradient(tf.reduce_max(lm, axis=-1, keepdims=True))  # [B, U+1, 1]
    am_exp, lm_exp = tf.exp(am - am_max), tf.exp(lm - lm_max)
    norm = tf.math.log(tf.einsum("btv,buv->btu", am_exp, lm_exp) + TINY)
    norm += am_max + tf.transpose(lm_max, [0, 2, 1])
    am_label = tf.gather(am, next_label, axis=2, batch_dims=1)
    am_norm = None
    if unigram is not None:
        am_norm = tf.math.log(tf.einsum("btv,v->bt", am_exp, unigram)) + am_max[..., 0]
    lm_label = tf.gather(lm, next_label[..., None], axis=2, batch_dims=2)[..., 0]
    lm_norm = tf.math.log(tf.reduce_sum(lm_exp, axis=-1)) + lm_max[..., 0]
    return Terms(norm, am_label, am[..., blank], am_norm, lm_label, lm[..., blank], lm_norm)


def trivial_terms(
    encoded,
    lm,
    next_label,
    *,
    kernel,
    bias,
    blank: int = 0,
    unigram=None,
    chunk_bytes: int = DEFAULT_CHUNK_BYTES,
) -> Terms:
    """The `Terms` (float32) of am = encoded @ kernel + bias and lm, as `plain_terms` gives
    them, chunk by chunk (am_norm is None without `unigram`).

    encoded: [B, T, D] (any float dtype; the projection runs in it, as the Dense layer
    would); kernel [D, V], bias [V]; lm: [B, U+1, V]; next_label: [B, U+1] int;
    unigram: [V] or None. About `chunk_bytes` of float32 temporaries per chunk.
    """
    kernel = tf.cast(kernel, encoded.dtype)
    bias = tf.cast(bias, encoded.dtype)
    lm = tf.cast(lm, tf.float32)
    next_label = tf.cast(next_label, tf.int32)
    smoothing = unigram is not None
    unigram = tf.cast(unigram, tf.float32) if smoothing else tf.zeros([1], tf.float32)
    # Per frame a chunk holds about 6·B·V float32 values (am, its exponentials, d am and
    # its terms): one cell of no hidden width.
    chunk = joint_chunk_frames(encoded, 1, 0, static_or_dynamic(kernel, 1), chunk_bytes)
    blank = int(blank)

    @tf.custom_gradient
    def core(encoded, kernel, bias, lm, unigram):
        encoded, kernel, bias, lm, unigram = (
            tf.stop_gradient(x) for x in (encoded, kernel, bias, lm, unigram)
        )
        frames = tf.shape(encoded)[1]
        enc_c, chunks = in_chunks(encoded, chunk)
        lm_max = tf.reduce_max(lm, axis=-1, keepdims=True)  # [B, U+1, 1]
        lm_exp = tf.exp(lm - lm_max)
        norm, am_label, am_blank, am_norm, am_max = _forward(
            enc_c, kernel, bias, lm_exp, lm_max, next_label, unigram, blank, smoothing,
            chunks, frames,
        )  # fmt: skip
        lm_ids = tf.stack([next_label, tf.fill(tf.shape(next_label), blank)], axis=-1)
        lm_label, lm_blank = tf.unstack(tf.gather(lm, lm_ids, axis=2, batch_dims=2), axis=-1)
        lm_sum = tf.reduce_sum(lm_exp, axis=-1)  # [B, U+1]
        lm_norm = tf.math.log(lm_sum) + lm_max[..., 0]

        def grad(g_norm, g_label, g_blank, g_am_norm, g_lm_label, g_lm_blank, g_lm_norm):
            g_am_norm = g_am_norm if smoothing else tf.zeros_like(am_blank)
            d_enc, d_kernel, d_bias, lm_weight, d_unigram = _backward(
                enc_c, kernel, bias, lm_exp, lm_max, next_label, unigram, blank, smoothing,
                chunks, frames, chunk, norm, am_norm, am_max,
                tf.cast(g_norm, tf.float32), tf.cast(g_label, tf.float32),
                tf.cast(g_blank, tf.float32), tf.cast(g_am_norm, tf.float32),
            )  # fmt: skip
            g_lm_label, g_lm_blank, g_lm_norm = (
                tf.zeros_like(lm_sum) if g is None else tf.cast(g, tf.float32)
                for g in (g_lm_label, g_lm_blank, g_lm_norm)
            )
            lm_weight += (g_lm_norm / lm_sum)[..., None]  # lm_norm's gradient: the softmax
            picks = tf.stack([g_lm_label, g_lm_blank], axis=-1)
            d_lm = add_at_last(lm_exp * lm_weight, lm_ids, picks)
            return (
                tf.cast(d_enc, encoded.dtype),
                tf.cast(d_kernel, kernel.dtype),
                tf.cast(d_bias, bias.dtype),
                d_lm,
                d_unigram,
            )

        return (norm, am_label, am_blank, am_norm, lm_label, lm_blank, lm_norm), grad

    terms = Terms(*core(encoded, kernel, bias, lm, unigram))
    return terms if smoothing else terms._replace(am_norm=None)


def _chunk_am(enc_c, kernel, bias, i):
    """am [B, C, V] float32 of chunk i, its per-frame max [B, C, 1] and exp(am - max)."""
    enc = tf.gather(enc_c, i, axis=1)  # [B, C, D]
    shape = tf.shape(enc)
    am = tf.matmul(tf.reshape(enc, [-1, shape[2]]), kernel) + bias
    am = tf.cast(tf.reshape(am, [shape[0], shape[1], -1]), tf.float32)
    am_max = tf.reduce_max(am, axis=-1, keepdims=True)
    return enc, am, am_max, tf.exp(am - am_max)


# Graph functions even for eager callers (see asrkit.losses.fused).
@functools.partial(tf.function, reduce_retracing=True, autograph=False)
def _forward(enc_c, kernel, bias, lm_exp, lm_max, next_label, unigram, blank, smoothing,
             chunks, frames):  # fmt: skip
    lm_max_row = tf.transpose(lm_max, [0, 2, 1])  # [B, 1, U+1]

    def forward_chunk(i):
        _, am, am_max, am_exp = _chunk_am(enc_c, kernel, bias, i)
        norm = tf.math.log(tf.einsum("bcv,buv->bcu", am_exp, lm_exp) + TINY)
        norm += am_max + lm_max_row
        am_label = tf.gather(am, next_label, axis=2, batch_dims=1)
        if smoothing:
            am_norm = tf.math.log(tf.einsum("bcv,v->bc", am_exp, unigram)) + am_max[..., 0]
        else:
            am_norm = tf.zeros_like(am_max[..., 0])
        return norm, am_label, am[..., blank : blank + 1], am_norm[..., None], am_max

    norm, am_label, am_blank, am_norm, am_max = map_chunks(chunks, frames, forward_chunk, 5)
    return norm, am_label, am_blank[..., 0], am_norm[..., 0], am_max[..., 0]


@functools.partial(tf.function, reduce_retracing=True, autograph=False)
def _backward(enc_c, kernel, bias, lm_exp, lm_max, next_label, unigram, blank, smoothing,
              chunks, frames, chunk, norm, am_norm, am_max, g_norm, g_label, g_blank,
              g_am_norm):  # fmt: skip
    lm_max_row = tf.transpose(lm_max, [0, 2, 1])  # [B, 1, U+1]
    # w[t, u] = g_norm · exp(am_max[t] + lm_max[u] − norm[t, u]): the softmax over v of
    # am + lm is exp(am − am_max) · exp(lm − lm_max) · w / g_norm.
    weight = g_norm * tf.exp(am_max[..., None] + lm_max_row - norm)
    weight_c, label_c = in_chunks(weight, chunk)[0], in_chunks(g_label, chunk)[0]
    per_frame = tf.stack([g_blank, g_am_norm * tf.exp(am_max - am_norm)], axis=-1)
    per_frame_c = in_chunks(per_frame, chunk)[0]  # [B, N, C, 2]

    def backward_chunk(i):
        enc, _, _, am_exp = _chunk_am(enc_c, kernel, bias, i)
        w = tf.gather(weight_c, i, axis=1)  # [B, C, U+1]
        g_lab = tf.gather(label_c, i, axis=1)
        g_blank_c, g_norm_am = tf.unstack(tf.gather(per_frame_c, i, axis=1), axis=-1)
        d_am = am_exp * tf.einsum("bcu,buv->bcv", w, lm_exp)
        # The picks' gradients where they fall: U+1 labels and the blank per frame.
        labels = tf.broadcast_to(next_label[:, None], tf.shape(g_lab))  # [B, C, U+1]
        ids = tf.concat([labels, tf.fill(tf.shape(g_blank_c[..., None]), blank)], axis=-1)
        d_am = add_at_last(d_am, ids, tf.concat([g_lab, g_blank_c[..., None]], axis=-1))
        lm_part = tf.einsum("bcu,bcv->buv", w, am_exp)  # times exp(lm) once, after the loop
        d_unigram = tf.zeros_like(unigram, tf.float32)
        if smoothing:
            d_am += g_norm_am[..., None] * am_exp * unigram
            d_unigram = tf.einsum("bc,bcv->v", g_norm_am, am_exp)
        shape = tf.shape(d_am)
        flat_d = tf.reshape(d_am, [-1, shape[2]])
        flat_enc = tf.cast(tf.reshape(enc, [-1, tf.shape(enc)[2]]), tf.float32)
        d_kernel = tf.matmul(flat_enc, flat_d, transpose_a=True)
        d_enc = tf.matmul(flat_d, tf.cast(kernel, tf.float32), transpose_b=True)
        # d_enc [B, C, D]; d_kernel, d_bias, the lm sum and d_unigram summed over chunks
        return tf.reshape(d_enc, [shape[0], shape[1], -1]), (
            d_kernel, tf.reduce_sum(flat_d, axis=0), lm_part, d_unigram,
        )  # fmt: skip

    totals = [tf.zeros_like(x, tf.float32) for x in (kernel, bias, lm_exp, unigram)]
    d_enc, (d_kernel, d_bias, lm_sum, d_unigram) = accumulate_chunks(
        chunks, frames, backward_chunk, totals
    )
    return d_enc, d_kernel, d_bias, lm_sum, d_unigram
