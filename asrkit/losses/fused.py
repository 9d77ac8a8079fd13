"""The joint network's output layer and the RNN-T loss in one pass, chunk by chunk.

`fused_joint_rnnt_loss` takes what the joint has *before* its widest tensor — the projected
encoder frames [B, T, H] and predictor states [B, U+1, H] — plus the output layer's kernel
[H, V] and bias [V], and returns the same per-utterance losses as

    logits = tanh(enc[:, :, None] + pred[:, None]) @ kernel + bias      # [B, T, U+1, V]
    rnnt_loss(logits, labels, logit_lengths, label_lengths)

without ever holding [B, T, U+1, V] (or the hidden [B, T, U+1, H]) for the whole batch:

* forward: frames are taken `chunk` at a time; each chunk's hidden and logits (float32
  from the matmul on) are reduced at once to the three [B, chunk, U+1] slices the lattice
  needs (log-sum-exp, blank and next-label log-probs) and dropped;
* the alpha/beta recursion and the edge posteriors are those of `asrkit.losses.rnnt`;
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

from asrkit.losses.rnnt import (
    _forward_backward,
    _Lattice,
    _mask_emissions,
    _next_labels,
    _posteriors,
)

DEFAULT_CHUNK_BYTES = 64 * 2**20


def fused_joint_rnnt_loss(
    encoder_hidden: tf.Tensor,
    predictor_hidden: tf.Tensor,
    kernel: tf.Tensor,
    bias: tf.Tensor | None,
    labels: tf.Tensor,
    logit_lengths: tf.Tensor,
    label_lengths: tf.Tensor,
    blank: int = 0,
    chunk_frames: int | None = None,
    chunk_bytes: int = DEFAULT_CHUNK_BYTES,
    delay_penalty: float = 0.0,
) -> tf.Tensor:
    """Per-utterance RNN-T loss [B] (float32) of the joint `tanh(e + p) @ kernel + bias`.

    Args:
      encoder_hidden: [B, T, H] projected encoder frames (the joint's encoder projection).
      predictor_hidden: [B, U+1, H] projected predictor states.
      kernel: [H, V] output layer kernel; bias: [V] or None.
      labels, logit_lengths, label_lengths, blank, delay_penalty: as for `rnnt_loss`.
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
    chunk = _chunk_frames(encoder_hidden, predictor_hidden, kernel, chunk_frames, chunk_bytes)
    return _loss(
        encoder_hidden, predictor_hidden, kernel, bias, labels, logit_lengths, label_lengths,
        int(blank), chunk, float(delay_penalty),
    )  # fmt: skip


def _chunk_frames(enc, pred, kernel, chunk_frames, chunk_bytes):
    """Frames per chunk: given, or from the budget — per frame the backward pass holds
    about B·(U+1)·(6V + 4H) float32 values at its peak (logits, softmax, the gradient and
    its terms; the hidden state, its float32 copy and two gradients), measured with
    `tools/bench_joint.py`."""
    if chunk_frames is not None:
        if int(chunk_frames) < 1:
            raise ValueError(f"chunk_frames must be >= 1, got {chunk_frames}")
        return tf.constant(int(chunk_frames), tf.int32)
    static = [enc.shape[0], enc.shape[1], pred.shape[1], *kernel.shape]
    if all(d is not None for d in static):  # known while tracing (XLA traces per shape)
        batch, frames, u1, hidden, vocab = static
        per_frame = batch * u1 * (6 * vocab + 4 * hidden) * 4
        return tf.constant(min(max(int(chunk_bytes) // max(per_frame, 1), 1), max(frames, 1)))
    # Integer arithmetic on shapes only, so that XLA can still evaluate it at compile time.
    shape = tf.shape(enc, out_type=tf.int64)
    u1 = tf.shape(pred, out_type=tf.int64)[1]
    hidden, vocab = tf.unstack(tf.shape(kernel, out_type=tf.int64))
    per_frame = shape[0] * u1 * (6 * vocab + 4 * hidden) * 4
    return _frames_in_budget(chunk_bytes, per_frame, shape[1])


def _frames_in_budget(chunk_bytes, per_frame, frames):
    """int32 frames per chunk: as many as `chunk_bytes` hold at `per_frame` bytes each, at
    least 1 and at most `frames` (int64 shape arithmetic, which XLA evaluates when it
    compiles)."""
    fit = tf.constant(int(chunk_bytes), tf.int64) // tf.maximum(per_frame, 1)
    return tf.cast(tf.clip_by_value(fit, 1, tf.maximum(frames, 1)), tf.int32)


def _chunk_logits(enc_chunks, pred, kernel, bias, i):
    """Hidden [B, C, U+1, H] (compute dtype) and float32 logits [B, C, U+1, V] of chunk i
    of `enc_chunks` [B, N, C, H] — frames past T are zero padding, masked later. (A gather
    of chunk i, not a slice of size C: XLA needs the sizes inside a loop to be constant.)"""
    enc_c = tf.gather(enc_chunks, i, axis=1)
    return _joint_cells(enc_c[:, :, None, :] + pred[:, None, :, :], kernel, bias)


def _joint_cells(pre, kernel, bias):
    """The joint on cells [B, C, X, H] before its tanh -> hidden (compute dtype) and float32
    logits [B, C, X, V]."""
    hidden = tf.tanh(pre)
    logits = _cells_matmul(hidden, kernel) + bias
    return hidden, tf.cast(logits, tf.float32)


def _picked(logits, labels, blank):
    """Log-sum-exp, blank and `labels` [B, C, X] log-probs [B, C, X] of logits [B, C, X, V]."""
    lse = tf.reduce_logsumexp(logits, axis=-1)
    return lse, logits[..., blank] - lse, tf.gather(logits, labels, batch_dims=3) - lse


def _cells_gradient(hidden, logits, lse, post_blank, post_label, blank, labels, kernel):
    """The gradient of −Σ post · picked log-prob over cells [B, C, X]: d logits = softmax ·
    (post_blank + post_label) − post_blank · onehot(blank) − post_label · onehot(label)
    (`labels` [B, C or 1, X]; the one-hot terms added where they fall, never as [.., V]),
    then -> (d before the tanh [B, C, X, H], d kernel, d bias), all float32."""
    softmax = tf.exp(logits - lse[..., None])
    d_logits = softmax * (post_blank + post_label)[..., None]  # [B, C, X, V] float32
    labels = tf.broadcast_to(labels, tf.shape(post_label))
    ids = tf.stack([tf.fill(tf.shape(labels), blank), labels], axis=-1)  # [B, C, X, 2]
    d_logits = add_at_last(d_logits, ids, -tf.stack([post_blank, post_label], axis=-1))
    hidden32 = tf.cast(hidden, tf.float32)
    flat_hidden = tf.reshape(hidden32, [-1, tf.shape(hidden32)[3]])
    flat_d_logits = tf.reshape(d_logits, [-1, tf.shape(d_logits)[3]])
    d_kernel = tf.matmul(flat_hidden, flat_d_logits, transpose_a=True)
    d_bias = tf.reduce_sum(flat_d_logits, axis=0)
    d_hidden = _cells_matmul(d_logits, tf.cast(kernel, tf.float32), transpose_w=True)
    return d_hidden * (1.0 - tf.square(hidden32)), d_kernel, d_bias  # through tanh


def add_at_last(x, ids, values):
    """x [..., V] with values [..., K] added at x[..., ids] (ids [..., K] int32: K positions
    per row of x; repeated positions sum): a scatter of K numbers per row instead of a
    product with a one-hot of x's size."""
    vocab, per_row = tf.shape(x, tf.int64)[-1], tf.shape(ids, tf.int64)[-1]
    rows = tf.range(tf.size(ids, tf.int64)) // per_row  # int64: x may exceed 2**31 values
    flat = tf.reshape(rows * vocab + tf.reshape(tf.cast(ids, tf.int64), [-1]), [-1, 1])
    added = tf.tensor_scatter_nd_add(tf.reshape(x, [-1]), flat, tf.reshape(values, [-1]))
    return tf.reshape(added, tf.shape(x))


def _cells_matmul(x, w, transpose_w: bool = False):
    """x [B, C, U+1, K] @ w: one 2-D matmul over all cells (TF 2.21's broadcast batch matmul
    is slower on CPU, and with transpose_b corrupts memory when several logical CPU devices
    are configured)."""
    shape = tf.shape(x)
    flat = tf.matmul(tf.reshape(x, [-1, shape[3]]), w, transpose_b=transpose_w)
    return tf.reshape(flat, tf.concat([shape[:3], tf.shape(flat)[1:]], 0))


def _in_chunks(x, chunk):
    """[B, T, K] -> [B, N, C, K] (zero-padded to N·C frames) and N."""
    shape = tf.shape(x)
    chunks = (shape[1] + chunk - 1) // chunk
    padded = tf.pad(x, [[0, 0], [0, chunks * chunk - shape[1]], [0, 0]])
    return tf.reshape(padded, [shape[0], chunks, chunk, shape[2]]), chunks


def _loss(enc, pred, kernel, bias, labels, logit_lengths, label_lengths, blank, chunk, delay):
    @tf.custom_gradient
    def core(enc, pred, kernel, bias):
        enc_s, pred_s = tf.stop_gradient(enc), tf.stop_gradient(pred)
        kernel_s, bias_s = tf.stop_gradient(kernel), tf.stop_gradient(bias)
        frames, u1 = tf.shape(enc_s)[1], tf.shape(pred_s)[1]
        next_label = _next_labels(labels, label_lengths, u1)
        padded, chunks = _in_chunks(enc_s, chunk)

        lse, log_blank, log_label = _forward_chunks(
            padded, chunks, pred_s, kernel_s, bias_s, next_label, blank, chunk, frames
        )
        log_blank, log_label = _mask_emissions(
            log_blank, log_label, logit_lengths, label_lengths, delay
        )
        alpha, beta, blank_d, label_d, terminal, log_prob = _forward_backward(
            log_blank, log_label, logit_lengths, label_lengths
        )
        saved = _Lattice(log_prob, lse, next_label, alpha, beta, blank_d, label_d, terminal)

        def grad(upstream):
            return _backward(padded, chunks, pred_s, kernel_s, bias_s, upstream, saved,
                             blank, chunk, frames)  # fmt: skip

        return -log_prob, grad

    return core(enc, pred, kernel, bias)


# Graph functions even for eager callers: a TensorArray in an eager while loop crashes
# TensorFlow 2.21 when several logical devices are configured (and is slow anyway).
@functools.partial(tf.function, reduce_retracing=True)
def _forward_chunks(padded, chunks, pred, kernel, bias, next_label, blank, chunk, frames):
    """Log-sum-exp, blank and next-label log-probs [B, T, U+1], one chunk at a time."""

    def forward_chunk(i, lse_acc, blank_acc, label_acc):
        _, logits = _chunk_logits(padded, pred, kernel, bias, i)
        label_index = tf.broadcast_to(next_label[:, None, :], tf.shape(logits)[:3])
        lse, picked_blank, picked_label = _picked(logits, label_index, blank)  # [B, C, U+1]
        return (i + 1, lse_acc.write(i, lse), blank_acc.write(i, picked_blank),
                label_acc.write(i, picked_label))  # fmt: skip

    arrays = [tf.TensorArray(tf.float32, size=chunks) for _ in range(3)]
    _, *arrays = _chunk_loop(chunks, forward_chunk, [tf.constant(0), *arrays])
    return tuple(_stitch(a, frames) for a in arrays)


def _chunk_loop(chunks, body, init):
    """`body(i, *state)` for chunks i = 0 .. chunks - 1, one chunk at a time: the default
    lets up to 10 iterations run at once, each holding its chunk's temporaries, which
    multiplies the memory the chunks are sized to bound."""
    return tf.while_loop(lambda i, *_: i < chunks, body, init, parallel_iterations=1)


def _stitch(array: tf.TensorArray, frames) -> tf.Tensor:
    """Chunks [N, B, C, U+1] -> [B, T, U+1] (padding frames dropped)."""
    stacked = array.stack()
    shape = tf.shape(stacked)
    joined = tf.reshape(tf.transpose(stacked, [1, 0, 2, 3]), [shape[1], -1, shape[3]])
    return joined[:, :frames]


@functools.partial(tf.function, reduce_retracing=True)
def _backward(padded, chunks, pred, kernel, bias, upstream, saved, blank, chunk, frames):
    post_blank, post_label = _posteriors(saved, upstream, frames)  # [B, T, U+1]
    post_blank, post_label, lse = (_in_chunks(x, chunk)[0]
                                   for x in (post_blank, post_label, saved.lse))  # fmt: skip
    labels = saved.next_label[:, None]  # [B, 1, U+1]

    def backward_chunk(i, d_enc, d_pred, d_kernel, d_bias):
        hidden, logits = _chunk_logits(padded, pred, kernel, bias, i)
        blank_c, label_c = tf.gather(post_blank, i, axis=1), tf.gather(post_label, i, axis=1)
        d_pre, chunk_kernel, chunk_bias = _cells_gradient(
            hidden, logits, tf.gather(lse, i, axis=1), blank_c, label_c, blank, labels, kernel,
        )  # fmt: skip
        d_enc = d_enc.write(i, tf.reduce_sum(d_pre, axis=2))  # [B, C, H]
        d_pred = tf.ensure_shape(d_pred + tf.reduce_sum(d_pre, axis=1), pred.shape)
        d_kernel = tf.ensure_shape(d_kernel + chunk_kernel, kernel.shape)
        return i + 1, d_enc, d_pred, d_kernel, tf.ensure_shape(d_bias + chunk_bias, bias.shape)

    init = [
        tf.constant(0),
        tf.TensorArray(tf.float32, size=chunks),
        tf.zeros(tf.shape(pred), tf.float32),
        tf.zeros(tf.shape(kernel), tf.float32),
        tf.zeros(tf.shape(bias), tf.float32),
    ]
    _, d_enc, d_pred, d_kernel, d_bias = _chunk_loop(chunks, backward_chunk, init)
    d_enc = _stitch(d_enc, frames)
    return (
        tf.cast(d_enc, padded.dtype),
        tf.cast(d_pred, pred.dtype),
        tf.cast(d_kernel, kernel.dtype),
        tf.cast(d_bias, bias.dtype),
    )
