"""The joint's log-probs on the pruned loss's band, chunk by chunk, never holding the band's
logits.

`band_log_probs` returns, for each frame t and band column s, the blank and next-label
log-probs of the joint `tanh(enc[t] + pred_band[t, s]) @ kernel + bias` — what
`pruned_loss` needs from the band's [B, T, S, V] log-softmax — while holding only one chunk
of frames' hidden states and logits at a time, in the forward pass and again (recomputed)
in the backward pass, as `fused_joint_rnnt_loss` does for the whole lattice.

The gradient of picked = logit[k] − logsumexp(logits) is onehot(k) − softmax, so with
upstream g_blank and g_label [B, T, S]:

    d logits = g_blank · onehot(blank) + g_label · onehot(label) − (g_blank + g_label) · softmax

then through the output layer and tanh to the encoder frames (summed over the band), the
band's predictor rows, the kernel and the bias.
"""

from __future__ import annotations

import functools

import tensorflow as tf

from asrkit.losses.fused import (
    DEFAULT_CHUNK_BYTES,
    _cells_gradient,
    _chunk_frames,
    _chunk_loop,
    _in_chunks,
    _joint_cells,
    _picked,
    _stitch,
)


def band_log_probs(
    encoder_hidden: tf.Tensor,
    predictor_band: tf.Tensor,
    kernel: tf.Tensor,
    bias: tf.Tensor,
    band_labels: tf.Tensor,
    blank: int = 0,
    chunk_bytes: int = DEFAULT_CHUNK_BYTES,
) -> tuple[tf.Tensor, tf.Tensor]:
    """(log_blank, log_label) [B, T, S] float32.

    encoder_hidden: [B, T, H]; predictor_band: [B, T, S, H] (each frame's band of projected
    predictor rows); kernel [H, V], bias [V]: the output layer; band_labels [B, T, S]: the
    label whose log-prob each band cell needs (any valid id where it does not matter).
    """
    kernel = tf.cast(kernel, encoder_hidden.dtype)
    bias = tf.cast(bias, encoder_hidden.dtype)
    band_labels = tf.cast(band_labels, tf.int32)
    # Per frame a chunk holds B·S·(6V + 4H) values, as a fused chunk does with U+1 = S.
    chunk = _chunk_frames(encoder_hidden, predictor_band[:, 0], kernel, None, chunk_bytes)
    blank = int(blank)

    @tf.custom_gradient
    def core(enc, band, kernel, bias):
        enc, band = tf.stop_gradient(enc), tf.stop_gradient(band)
        kernel, bias = tf.stop_gradient(kernel), tf.stop_gradient(bias)
        frames, span = tf.shape(enc)[1], tf.shape(band)[2]
        enc_c, chunks = _in_chunks(enc, chunk)
        band_c = _band_chunks(band, chunk)
        labels_c, _ = _in_chunks(band_labels, chunk)
        lse, log_blank, log_label = _forward(
            enc_c, band_c, kernel, bias, labels_c, blank, chunks, frames
        )

        def grad(g_blank, g_label):
            g_blank_c, _ = _in_chunks(tf.cast(g_blank, tf.float32), chunk)
            g_label_c, _ = _in_chunks(tf.cast(g_label, tf.float32), chunk)
            lse_c, _ = _in_chunks(lse, chunk)
            d_enc, d_band, d_kernel, d_bias = _backward(
                enc_c, band_c, kernel, bias, labels_c, blank, chunks, frames, lse_c,
                g_blank_c, g_label_c,
            )  # fmt: skip
            shape = tf.shape(band)
            d_band = tf.reshape(d_band, [shape[0], frames, span, shape[3]])
            return (
                tf.cast(d_enc, enc.dtype),
                tf.cast(d_band, band.dtype),
                tf.cast(d_kernel, kernel.dtype),
                tf.cast(d_bias, bias.dtype),
            )

        return (log_blank, log_label), grad

    return core(encoder_hidden, predictor_band, kernel, bias)


def _band_chunks(band, chunk):
    """[B, T, S, H] -> [B, N, C, S·H] (zero-padded frames)."""
    shape = tf.shape(band)
    flat = tf.reshape(band, [shape[0], shape[1], shape[2] * shape[3]])
    return _in_chunks(flat, chunk)[0]


def _chunk(enc_c, band_c, kernel, bias, i):
    """Chunk i: hidden [B, C, S, H] (compute dtype) and float32 logits [B, C, S, V]."""
    enc = tf.gather(enc_c, i, axis=1)  # [B, C, H]
    band = tf.gather(band_c, i, axis=1)  # [B, C, S·H]
    shape = tf.shape(enc)
    band = tf.reshape(band, [shape[0], shape[1], -1, shape[2]])
    return _joint_cells(enc[:, :, None, :] + band, kernel, bias)


# Graph functions even for eager callers (see asrkit.losses.fused).
@functools.partial(tf.function, reduce_retracing=True)
def _forward(enc_c, band_c, kernel, bias, labels_c, blank, chunks, frames):
    def body(i, lse_acc, blank_acc, label_acc):
        _, logits = _chunk(enc_c, band_c, kernel, bias, i)
        lse, picked_blank, picked_label = _picked(logits, tf.gather(labels_c, i, axis=1), blank)
        return (i + 1, lse_acc.write(i, lse), blank_acc.write(i, picked_blank),
                label_acc.write(i, picked_label))  # fmt: skip

    arrays = [tf.TensorArray(tf.float32, size=chunks) for _ in range(3)]
    _, *arrays = _chunk_loop(chunks, body, [tf.constant(0), *arrays])
    return tuple(_stitch(a, frames) for a in arrays)


@functools.partial(tf.function, reduce_retracing=True)
def _backward(enc_c, band_c, kernel, bias, labels_c, blank, chunks, frames, lse_c, g_blank_c,
              g_label_c):  # fmt: skip
    vocab = tf.shape(kernel)[1]
    blank_hot = tf.one_hot(blank, vocab, dtype=tf.float32)

    def body(i, d_enc, d_band, d_kernel, d_bias):
        hidden, logits = _chunk(enc_c, band_c, kernel, bias, i)
        label_hot = tf.one_hot(tf.gather(labels_c, i, axis=1), vocab, dtype=tf.float32)
        # The loss' upstream gradients are minus the posteriors `_cells_gradient` expects.
        d_pre, chunk_kernel, chunk_bias = _cells_gradient(
            hidden, logits, tf.gather(lse_c, i, axis=1), -tf.gather(g_blank_c, i, axis=1),
            -tf.gather(g_label_c, i, axis=1), blank_hot, label_hot, kernel,
        )  # fmt: skip
        d_kernel = tf.ensure_shape(d_kernel + chunk_kernel, kernel.shape)
        d_bias = tf.ensure_shape(d_bias + chunk_bias, bias.shape)
        shape = tf.shape(d_pre)
        d_enc = d_enc.write(i, tf.reduce_sum(d_pre, axis=2))  # [B, C, H]
        d_band = d_band.write(i, tf.reshape(d_pre, [shape[0], shape[1], -1]))  # [B, C, S·H]
        return i + 1, d_enc, d_band, d_kernel, d_bias

    init = [
        tf.constant(0),
        tf.TensorArray(tf.float32, size=chunks),
        tf.TensorArray(tf.float32, size=chunks),
        tf.zeros(tf.shape(kernel), tf.float32),
        tf.zeros(tf.shape(bias), tf.float32),
    ]
    _, d_enc, d_band, d_kernel, d_bias = _chunk_loop(chunks, body, init)
    return _stitch(d_enc, frames), _stitch(d_band, frames), d_kernel, d_bias
