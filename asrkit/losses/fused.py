"""The joint network's output layer and the RNN-T loss in one pass, chunk by chunk.

`fused_rnnt_loss` takes what the joint has *before* its widest tensor — the projected
encoder frames [B, T, H] and predictor states [B, U+1, H] — plus the output layer's kernel
[H, V] and bias [V], and returns the same per-utterance losses as

    logits = tanh(enc[:, :, None] + pred[:, None]) @ kernel + bias      # [B, T, U+1, V]
    rnnt_loss(logits, labels, logit_lengths, label_lengths)

without ever holding [B, T, U+1, V] (or the hidden [B, T, U+1, H]) for the whole batch:

* forward: frames are taken `chunk` at a time; each chunk's hidden and logits (float32
  from the matmul on) are reduced at once to the three [B, chunk, U+1] slices the lattice
  needs (log-sum-exp, blank and next-label log-probs) and dropped;
* the alpha/beta recursion and the edge posteriors are `asrkit.losses.lattice`'s;
* backward: each chunk is recomputed, d logits = softmax · occupancy − posteriors is
  formed for that chunk only, and the gradients of the encoder frames, the predictor
  states, the kernel and the bias are accumulated.

Peak extra memory is O(B · chunk · (U+1) · (V + H)) instead of O(B · T · (U+1) · (V + H));
the price is the joint computed twice (forward and backward). The chunk is chosen from a
memory budget (`chunk_bytes`) unless given in frames.
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
from asrkit.losses.lattice import Lattice, forward_backward, mask_emissions, next_labels, posteriors


def fused_rnnt_loss(
    encoder_hidden: tf.Tensor,
    predictor_hidden: tf.Tensor,
    labels: tf.Tensor,
    logit_lengths: tf.Tensor,
    label_lengths: tf.Tensor,
    *,
    kernel: tf.Tensor,
    bias: tf.Tensor | None,
    blank: int = 0,
    chunk_frames: int | None = None,
    chunk_bytes: int = DEFAULT_CHUNK_BYTES,
    delay_penalty: float = 0.0,
    fastemit_lambda: float = 0.0,
    activation: str = "tanh",
) -> tf.Tensor:
    """Per-utterance RNN-T loss [B] (float32) of the joint `act(e + p) @ kernel + bias`
    (`activation` tanh or relu).

    Args:
      encoder_hidden: [B, T, H] projected encoder frames (the joint's encoder projection).
      predictor_hidden: [B, U+1, H] projected predictor states.
      kernel: [H, V] output layer kernel; bias: [V] or None.
      labels, logit_lengths, label_lengths, blank, delay_penalty, fastemit_lambda: as for
        `rnnt_loss`.
      chunk_frames: frames per chunk; default: as many as fit `chunk_bytes` of float32
        chunk temporaries (at least 1).
    """
    encoder_hidden = tf.convert_to_tensor(encoder_hidden)
    predictor_hidden = tf.convert_to_tensor(predictor_hidden)
    kernel = tf.convert_to_tensor(kernel)
    if bias is None:
        bias = tf.zeros([tf.shape(kernel)[1]], kernel.dtype)
    bias = tf.convert_to_tensor(bias)
    # Under mixed precision the hidden states are float16/bfloat16 while the variables are
    # float32: compute the chunk matmul in the hidden dtype, as the Dense layer would.
    kernel, bias = tf.cast(kernel, encoder_hidden.dtype), tf.cast(bias, encoder_hidden.dtype)
    labels = tf.cast(labels, tf.int32)
    logit_lengths = tf.cast(logit_lengths, tf.int32)
    label_lengths = tf.cast(label_lengths, tf.int32)
    chunk = joint_chunk_frames(
        encoder_hidden, static_or_dynamic(predictor_hidden, 1), static_or_dynamic(kernel, 0),
        static_or_dynamic(kernel, 1), chunk_bytes, chunk_frames,
    )  # fmt: skip
    return _loss(
        encoder_hidden, predictor_hidden, kernel, bias, labels, logit_lengths, label_lengths,
        int(blank), chunk, float(delay_penalty), activation, float(fastemit_lambda),
    )  # fmt: skip


def _chunk_logits(enc_chunks, pred, kernel, bias, i, activation):
    """Hidden [B, C, U+1, H] (compute dtype) and float32 logits [B, C, U+1, V] of chunk i
    of `enc_chunks` [B, N, C, H] — frames past T are zero padding, masked later. (A gather
    of chunk i, not a slice of size C: XLA needs the sizes inside a loop to be constant.)"""
    enc_c = tf.gather(enc_chunks, i, axis=1)
    return joint_cells(enc_c[:, :, None, :] + pred[:, None, :, :], kernel, bias, activation)


def _loss(
    enc,
    pred,
    kernel,
    bias,
    labels,
    logit_lengths,
    label_lengths,
    blank,
    chunk,
    delay,
    act,
    fastemit=0.0,
):
    @tf.custom_gradient
    def core(enc, pred, kernel, bias):
        enc_s, pred_s = tf.stop_gradient(enc), tf.stop_gradient(pred)
        kernel_s, bias_s = tf.stop_gradient(kernel), tf.stop_gradient(bias)
        frames, u1 = tf.shape(enc_s)[1], tf.shape(pred_s)[1]
        next_label = next_labels(labels, label_lengths, u1)
        padded, chunks = in_chunks(enc_s, chunk)

        lse, log_blank, log_label = _forward_chunks(
            padded, chunks, pred_s, kernel_s, bias_s, next_label, blank, chunk, frames, act
        )
        log_blank, log_label = mask_emissions(
            log_blank, log_label, logit_lengths, label_lengths, delay
        )
        alpha, beta, blank_d, label_d, terminal, log_prob = forward_backward(
            log_blank, log_label, logit_lengths, label_lengths
        )
        saved = Lattice(log_prob, lse, next_label, alpha, beta, blank_d, label_d, terminal)

        def grad(upstream):
            return _backward(padded, chunks, pred_s, kernel_s, bias_s, upstream, saved,
                             blank, chunk, frames, act, 1.0 + fastemit)  # fmt: skip

        return -(1.0 + fastemit) * log_prob, grad

    return core(enc, pred, kernel, bias)


# Graph functions even for eager callers: a TensorArray in an eager while loop crashes
# TensorFlow 2.21 when several logical devices are configured (and is slow anyway).
@functools.partial(tf.function, reduce_retracing=True, autograph=False)
def _forward_chunks(padded, chunks, pred, kernel, bias, next_label, blank, chunk, frames, act):
    """Log-sum-exp, blank and next-label log-probs [B, T, U+1], one chunk at a time."""

    def forward_chunk(i):
        _, logits = _chunk_logits(padded, pred, kernel, bias, i, act)
        label_index = tf.broadcast_to(next_label[:, None, :], tf.shape(logits)[:3])
        return picked(logits, label_index, blank)  # lse, blank, label [B, C, U+1]

    return map_chunks(chunks, frames, forward_chunk, 3)


@functools.partial(tf.function, reduce_retracing=True, autograph=False)
def _backward(
    padded,
    chunks,
    pred,
    kernel,
    bias,
    upstream,
    saved,
    blank,
    chunk,
    frames,
    act,
    label_scale=1.0,
):
    post_blank, post_label = posteriors(saved, upstream, frames, label_scale)  # [B, T, U+1]
    post_blank, post_label, lse = (in_chunks(x, chunk)[0]
                                   for x in (post_blank, post_label, saved.lse))  # fmt: skip
    labels = saved.next_label[:, None]  # [B, 1, U+1]

    def backward_chunk(i):
        hidden, logits = _chunk_logits(padded, pred, kernel, bias, i, act)
        blank_c, label_c = tf.gather(post_blank, i, axis=1), tf.gather(post_label, i, axis=1)
        d_pre, chunk_kernel, chunk_bias = cells_gradient(
            hidden, logits, tf.gather(lse, i, axis=1), blank_c, label_c, blank, labels, kernel,
            act,
        )  # fmt: skip
        # d_enc [B, C, H]; d_pred, d_kernel, d_bias summed over chunks
        return tf.reduce_sum(d_pre, axis=2), (
            tf.reduce_sum(d_pre, axis=1),
            chunk_kernel,
            chunk_bias,
        )

    totals = [tf.zeros_like(pred, tf.float32), tf.zeros_like(kernel, tf.float32),
              tf.zeros_like(bias, tf.float32)]  # fmt: skip
    d_enc, (d_pred, d_kernel, d_bias) = accumulate_chunks(chunks, frames, backward_chunk, totals)
    return (
        tf.cast(d_enc, padded.dtype),
        tf.cast(d_pred, pred.dtype),
        tf.cast(d_kernel, kernel.dtype),
        tf.cast(d_bias, bias.dtype),
    )
