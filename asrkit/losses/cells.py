"""The joint evaluated on a chunk of lattice cells, and the gradient of a lattice loss
with respect to those cells: what the fused full loss and the pruned loss' band share."""

from __future__ import annotations

import tensorflow as tf

# The joint's activation, and its derivative from the activation's *output* (all the
# backward pass keeps): tanh' = 1 - tanh², relu' = [relu > 0].
ACTIVATIONS = {
    "tanh": (tf.tanh, lambda hidden: 1.0 - tf.square(hidden)),
    "relu": (tf.nn.relu, lambda hidden: tf.cast(hidden > 0, hidden.dtype)),
}


def joint_cells(pre, kernel, bias, activation: str = "tanh"):
    """The joint on cells [B, C, X, H] before its activation -> hidden (compute dtype) and
    float32 logits [B, C, X, V]."""
    hidden = ACTIVATIONS[activation][0](pre)
    logits = cells_matmul(hidden, kernel) + bias
    return hidden, tf.cast(logits, tf.float32)


def picked(logits, labels, blank):
    """Log-sum-exp, blank and `labels` [B, C, X] log-probs [B, C, X] of logits [B, C, X, V]."""
    lse = tf.reduce_logsumexp(logits, axis=-1)
    return lse, logits[..., blank] - lse, tf.gather(logits, labels, batch_dims=3) - lse


def cells_gradient(
    hidden, logits, lse, post_blank, post_label, blank, labels, kernel, activation="tanh"
):
    """The gradient of −Σ post · picked log-prob over cells [B, C, X]: d logits = softmax ·
    (post_blank + post_label) − post_blank · onehot(blank) − post_label · onehot(label)
    (`labels` [B, C or 1, X]; the one-hot terms added where they fall, never as [.., V]),
    then -> (d before the activation [B, C, X, H], d kernel, d bias), all float32.

    d logits is formed in float32; the two products with it run in `product_dtype` of the
    hidden state's dtype."""
    softmax = tf.exp(logits - lse[..., None])
    d_logits = softmax * (post_blank + post_label)[..., None]  # [B, C, X, V] float32
    labels = tf.broadcast_to(labels, tf.shape(post_label))
    ids = tf.stack([tf.fill(tf.shape(labels), blank), labels], axis=-1)  # [B, C, X, 2]
    d_logits = add_at_last(d_logits, ids, -tf.stack([post_blank, post_label], axis=-1))
    flat_d_logits = tf.reshape(d_logits, [-1, tf.shape(d_logits)[3]])
    d_bias = tf.reduce_sum(flat_d_logits, axis=0)
    dtype = product_dtype(hidden.dtype)
    d_low, hidden_low = tf.cast(d_logits, dtype), tf.cast(hidden, dtype)
    flat_hidden = tf.reshape(hidden_low, [-1, tf.shape(hidden)[3]])
    d_kernel = tf.matmul(flat_hidden, tf.reshape(d_low, tf.shape(flat_d_logits)), transpose_a=True)
    d_hidden = cells_matmul(d_low, tf.cast(kernel, dtype), transpose_w=True)
    hidden32 = hidden_low if dtype == tf.float32 else tf.cast(hidden, tf.float32)
    derivative = ACTIVATIONS[activation][1](hidden32)
    return tf.cast(d_hidden, tf.float32) * derivative, tf.cast(d_kernel, tf.float32), d_bias


def product_dtype(hidden_dtype):
    """The dtype of the joint's backward products for a hidden state of `hidden_dtype`:
    bfloat16 for bfloat16 — the rounding Keras' own Dense layers give their gradients
    under mixed_bfloat16, at the cores' bfloat16 speed — else float32 (a float16 product
    summed over thousands of loss-scaled rows would overflow)."""
    return tf.bfloat16 if hidden_dtype == tf.bfloat16 else tf.float32


def add_at_last(x, ids, values):
    """x [..., V] with values [..., K] added at x[..., ids] (ids [..., K] int32: K positions
    per row of x; repeated positions sum): a scatter of K numbers per row instead of a
    product with a one-hot of x's size."""
    vocab, per_row = tf.shape(x, tf.int64)[-1], tf.shape(ids, tf.int64)[-1]
    rows = tf.range(tf.size(ids, tf.int64)) // per_row  # int64: x may exceed 2**31 values
    flat = tf.reshape(rows * vocab + tf.reshape(tf.cast(ids, tf.int64), [-1]), [-1, 1])
    added = tf.tensor_scatter_nd_add(tf.reshape(x, [-1]), flat, tf.reshape(values, [-1]))
    return tf.reshape(added, tf.shape(x))


def cells_matmul(x, w, transpose_w: bool = False):
    """x [B, C, U+1, K] @ w: one 2-D matmul over all cells (TF 2.21's broadcast batch matmul
    is slower on CPU, and with transpose_b corrupts memory when several logical CPU devices
    are configured)."""
    shape = tf.shape(x)
    flat = tf.matmul(tf.reshape(x, [-1, shape[3]]), w, transpose_b=transpose_w)
    return tf.reshape(flat, tf.concat([shape[:3], tf.shape(flat)[1:]], 0))
