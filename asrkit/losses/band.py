"""The joint's log-probs on the pruned loss's band, chunk by chunk, never holding the band's
logits.

`band_log_probs` returns, for each frame t and band column s, the blank and next-label
log-probs of the joint `tanh(enc[t] + pred[rows[t, s]]) @ kernel + bias` — what
`pruned_loss` needs from the band's [B, T, S, V] log-softmax — while holding only one chunk
of frames' hidden states and logits at a time, in the forward pass and again (recomputed)
in the backward pass, as `fused_rnnt_loss` does for the whole lattice. The band's
predictor rows are gathered per chunk too (and their gradients summed back into the
predictor's [B, U+1, H]), never as a whole [B, T, S, H].

The gradient of picked = logit[k] − logsumexp(logits) is onehot(k) − softmax, so with
upstream g_blank and g_label [B, T, S]:

    d logits = g_blank · onehot(blank) + g_label · onehot(label) − (g_blank + g_label) · softmax

then through the output layer and tanh to the encoder frames (summed over the band), the
predictor rows (summed over the frames whose band holds them), the kernel and the bias.
"""

from __future__ import annotations

import functools

import tensorflow as tf

from asrkit.losses.cells import cells_gradient, joint_cells, picked
from asrkit.losses.chunks import (
    DEFAULT_CHUNK_BYTES,
    accumulate_chunks,
    in_chunks,
    joint_chunk_frames,
    map_chunks,
    static_or_dynamic,
)


def band_log_probs(
    encoder_hidden: tf.Tensor,
    predictor_hidden: tf.Tensor,
    rows: tf.Tensor,
    band_labels: tf.Tensor,
    *,
    kernel: tf.Tensor,
    bias: tf.Tensor,
    blank: int = 0,
    chunk_bytes: int = DEFAULT_CHUNK_BYTES,
    activation: str = "tanh",
) -> tuple[tf.Tensor, tf.Tensor]:
    """(log_blank, log_label) [B, T, S] float32 (the joint's `activation`: tanh or relu).

    encoder_hidden: [B, T, H]; predictor_hidden: [B, U+1, H] (the projected predictor
    rows); rows [B, T, S]: the predictor row of each frame's band column; kernel [H, V],
    bias [V]: the output layer; band_labels [B, T, S]: the label whose log-prob each band
    cell needs (any valid id where it does not matter).
    """
    kernel = tf.cast(kernel, encoder_hidden.dtype)
    bias = tf.cast(bias, encoder_hidden.dtype)
    rows = tf.cast(rows, tf.int32)
    band_labels = tf.cast(band_labels, tf.int32)
    # A band chunk holds S cells per frame where a fused chunk holds U+1.
    chunk = joint_chunk_frames(
        encoder_hidden, static_or_dynamic(rows, 2), static_or_dynamic(kernel, 0),
        static_or_dynamic(kernel, 1), chunk_bytes,
    )  # fmt: skip
    blank = int(blank)

    @tf.custom_gradient
    def core(enc, pred, kernel, bias):
        enc, pred = tf.stop_gradient(enc), tf.stop_gradient(pred)
        kernel, bias = tf.stop_gradient(kernel), tf.stop_gradient(bias)
        frames = tf.shape(enc)[1]
        enc_c, chunks = in_chunks(enc, chunk)
        rows_c, _ = in_chunks(rows, chunk)  # padding frames read row 0; their gradient is 0
        labels_c, _ = in_chunks(band_labels, chunk)
        lse, log_blank, log_label = _forward(
            enc_c, pred, rows_c, kernel, bias, labels_c, blank, chunks, frames, activation
        )

        def grad(g_blank, g_label):
            g_blank_c, _ = in_chunks(tf.cast(g_blank, tf.float32), chunk)
            g_label_c, _ = in_chunks(tf.cast(g_label, tf.float32), chunk)
            lse_c, _ = in_chunks(lse, chunk)
            d_enc, d_pred, d_kernel, d_bias = _backward(
                enc_c, pred, rows_c, kernel, bias, labels_c, blank, chunks, frames, lse_c,
                g_blank_c, g_label_c, activation,
            )  # fmt: skip
            return (
                tf.cast(d_enc, enc.dtype),
                tf.cast(d_pred, pred.dtype),
                tf.cast(d_kernel, kernel.dtype),
                tf.cast(d_bias, bias.dtype),
            )

        return (log_blank, log_label), grad

    return core(encoder_hidden, predictor_hidden, kernel, bias)


def _chunk(enc_c, pred, rows_c, kernel, bias, i, activation):
    """Chunk i: hidden [B, C, S, H] (compute dtype) and float32 logits [B, C, S, V]."""
    enc = tf.gather(enc_c, i, axis=1)  # [B, C, H]
    band = tf.gather(pred, tf.gather(rows_c, i, axis=1), axis=1, batch_dims=1)  # [B, C, S, H]
    return joint_cells(enc[:, :, None, :] + band, kernel, bias, activation)


# Graph functions even for eager callers (see asrkit.losses.fused).
@functools.partial(tf.function, reduce_retracing=True, autograph=False)
def _forward(enc_c, pred, rows_c, kernel, bias, labels_c, blank, chunks, frames, activation):
    def forward_chunk(i):
        _, logits = _chunk(enc_c, pred, rows_c, kernel, bias, i, activation)
        return picked(logits, tf.gather(labels_c, i, axis=1), blank)  # lse, blank, label

    return map_chunks(chunks, frames, forward_chunk, 3)


@functools.partial(tf.function, reduce_retracing=True, autograph=False)
def _backward(enc_c, pred, rows_c, kernel, bias, labels_c, blank, chunks, frames, lse_c,
              g_blank_c, g_label_c, activation):  # fmt: skip
    shape = tf.shape(pred)
    # Row r of utterance b is segment b·(U+1) + r of the flattened predictor.
    offsets = tf.range(shape[0])[:, None, None] * shape[1]  # [B, 1, 1]

    def backward_chunk(i):
        hidden, logits = _chunk(enc_c, pred, rows_c, kernel, bias, i, activation)
        # The loss' upstream gradients are minus the posteriors `cells_gradient` expects.
        d_pre, chunk_kernel, chunk_bias = cells_gradient(
            hidden, logits, tf.gather(lse_c, i, axis=1), -tf.gather(g_blank_c, i, axis=1),
            -tf.gather(g_label_c, i, axis=1), blank, tf.gather(labels_c, i, axis=1), kernel,
            activation,
        )  # fmt: skip
        segments = tf.reshape(tf.gather(rows_c, i, axis=1) + offsets, [-1])
        d_rows = tf.math.unsorted_segment_sum(
            tf.reshape(d_pre, [-1, shape[2]]), segments, shape[0] * shape[1]
        )
        # d_enc [B, C, H]; d_pred, d_kernel, d_bias summed over chunks
        return tf.reduce_sum(d_pre, axis=2), (tf.reshape(d_rows, shape), chunk_kernel, chunk_bias)

    totals = [tf.zeros_like(pred, tf.float32), tf.zeros_like(kernel, tf.float32),
              tf.zeros_like(bias, tf.float32)]  # fmt: skip
    d_enc, (d_pred, d_kernel, d_bias) = accumulate_chunks(chunks, frames, backward_chunk, totals)
    return d_enc, d_pred, d_kernel, d_bias
