"""Native TensorFlow RNN-Transducer loss with a hand-written gradient.

Owns `rnnt_loss` (per-utterance −log P(y|x)) and the Keras-friendly `RNNTLoss` wrapper.

How it is computed (shapes: B batch, T frames, U labels, V vocabulary):

* Only three [B, T, U+1] slices of the joint output are ever materialised: the
  log-sum-exp over V, the blank logit and the next-label logit (the warp-rnnt "gather"
  idea). Nothing of size [B, T, U+1, V] is kept between forward and backward except
  the logits themselves.
* The forward (alpha) and backward (beta) variables are computed along anti-diagonals
  t + u = n of the lattice, so each of the T + U sequential steps is one vectorised
  log-add-exp over [B, U+1]. The lattice is skewed into diagonal layout once with a
  pad-and-reshape trick (no gathers, XLA friendly).
* The gradient is softmax · occupancy − alignment posteriors, built in the backward
  pass from alpha/beta; padding outside (T_b, U_b) gets exactly zero.

Invalid lattice cells hold a large negative finite number instead of −inf, so
log-add-exp never sees inf − inf and no NaN can leak from padding.
"""

from __future__ import annotations

import functools

import keras
import tensorflow as tf

from asrkit.losses.lattice import (
    Lattice,
    forward_backward,
    mask_emissions,
    next_labels,
    posteriors,
)

REDUCTIONS = ("none", "sum", "mean_utterances", "mean_tokens")


def rnnt_loss(
    logits: tf.Tensor,
    labels: tf.Tensor,
    logit_lengths: tf.Tensor,
    label_lengths: tf.Tensor,
    *,
    blank: int = 0,
    fused_log_softmax: bool = True,
    delay_penalty: float = 0.0,
    fastemit_lambda: float = 0.0,
) -> tf.Tensor:
    """Per-utterance RNN-T loss −log P(y|x) (with `delay_penalty` > 0: of the
    delay-penalized lattice, see `mask_emissions`; with `fastemit_lambda` λ > 0: FastEmit
    as NeMo computes it, (1 + λ) · −log P(y|x) with every label edge's gradient scaled by
    1 + λ and every blank edge's kept).

    Args:
      logits: [B, T, U+1, V] joint output, any float dtype (maths runs in float32).
        With `fused_log_softmax=False` these must already be log-probabilities.
      labels: [B, U] int targets; entries at u >= label_lengths[b] are padding and
        are never read. May be [B, 0].
      logit_lengths: [B] int, frames per utterance, 1 <= T_b <= T.
      label_lengths: [B] int, labels per utterance, 0 <= U_b <= U.
      blank: index of the blank symbol in [0, V).
      fused_log_softmax: apply log-softmax over V inside the loss (gradients are then
        with respect to the raw logits).

    Returns:
      [B] float32 losses. The gradient with respect to `logits` has `logits.dtype`
      and is exactly zero outside each utterance's (T_b, U_b+1) region.
    """
    logits = tf.convert_to_tensor(logits)
    if not logits.dtype.is_floating:
        raise TypeError(f"rnnt_loss: logits must be floating point, got {logits.dtype.name}")
    labels = tf.cast(tf.convert_to_tensor(labels), tf.int32)
    logit_lengths = tf.cast(tf.convert_to_tensor(logit_lengths), tf.int32)
    label_lengths = tf.cast(tf.convert_to_tensor(label_lengths), tf.int32)
    blank = int(blank)
    _check_static(logits, labels, logit_lengths, label_lengths, blank)
    checks = _runtime_checks(logits, labels, logit_lengths, label_lengths, blank)
    with tf.control_dependencies(checks):
        logits = tf.identity(logits)
    return _rnnt_loss_with_grad(
        logits, labels, logit_lengths, label_lengths, blank, bool(fused_log_softmax),
        float(delay_penalty), float(fastemit_lambda),
    )  # fmt: skip


def _check_static(logits, labels, logit_lengths, label_lengths, blank):
    """Errors that can be raised while tracing, from static shapes alone."""
    if logits.shape.rank is not None and logits.shape.rank != 4:
        raise ValueError(f"rnnt_loss: logits must be [B, T, U+1, V], got shape {logits.shape}")
    if labels.shape.rank is not None and labels.shape.rank != 2:
        raise ValueError(f"rnnt_loss: labels must be [B, U], got shape {labels.shape}")
    for name, t in (("logit_lengths", logit_lengths), ("label_lengths", label_lengths)):
        if t.shape.rank is not None and t.shape.rank != 1:
            raise ValueError(f"rnnt_loss: {name} must be [B], got shape {t.shape}")
    batch = [logits.shape[0], labels.shape[0], logit_lengths.shape[0], label_lengths.shape[0]]
    known = {b for b in batch if b is not None}
    if len(known) > 1:
        raise ValueError(
            "rnnt_loss: batch sizes differ: logits {}, labels {}, logit_lengths {}, "
            "label_lengths {}".format(*batch)
        )
    u1, max_u = logits.shape[2], labels.shape[1]
    if u1 is not None and max_u is not None and u1 != max_u + 1:
        raise ValueError(
            f"rnnt_loss: logits.shape[2] must be labels.shape[1] + 1 (U+1), got {u1} and {max_u}"
        )
    vocab = logits.shape[3]
    if vocab is not None and not 0 <= blank < vocab:
        raise ValueError(f"rnnt_loss: blank={blank} is outside [0, V={vocab})")
    if blank < 0:
        raise ValueError(f"rnnt_loss: blank={blank} must be >= 0")


def _runtime_checks(logits, labels, logit_lengths, label_lengths, blank):
    """Assertions on values; they raise in eager and graph mode (XLA compiles them away)."""
    shape = tf.shape(logits)
    batch, frames, vocab = shape[0], shape[1], shape[3]
    max_u = tf.shape(labels)[1]
    label_valid = tf.range(max_u)[None, :] < label_lengths[:, None]
    valid_labels = tf.boolean_mask(labels, label_valid)
    return [
        tf.debugging.assert_equal(shape[2], max_u + 1, message="rnnt_loss: logits.shape[2] != U+1"),
        tf.debugging.assert_equal(
            tf.stack([tf.shape(labels)[0], tf.size(logit_lengths), tf.size(label_lengths)]),
            tf.fill([3], batch),
            message="rnnt_loss: labels/logit_lengths/label_lengths batch size != logits batch size",
        ),
        tf.debugging.assert_less(blank, vocab, message="rnnt_loss: blank must be < V"),
        tf.debugging.assert_greater_equal(
            logit_lengths, 1, message="rnnt_loss: logit_lengths must be >= 1"
        ),
        tf.debugging.assert_less_equal(
            logit_lengths, frames, message="rnnt_loss: logit_lengths must be <= logits.shape[1]"
        ),
        tf.debugging.assert_non_negative(
            label_lengths, message="rnnt_loss: label_lengths must be >= 0"
        ),
        tf.debugging.assert_less_equal(
            label_lengths, max_u, message="rnnt_loss: label_lengths must be <= labels.shape[1] (U)"
        ),
        tf.debugging.assert_non_negative(valid_labels, message="rnnt_loss: labels must be >= 0"),
        tf.debugging.assert_less(valid_labels, vocab, message="rnnt_loss: labels must be < V"),
        tf.debugging.Assert(
            tf.reduce_all(tf.not_equal(valid_labels, blank)),
            ["rnnt_loss: a label equals the blank id", blank],
        ),
    ]


def _emission_log_probs(x, labels, logit_lengths, label_lengths, blank, fused, delay=0.0):
    """Blank and next-label log-probs [B, T, U+1] (log-zero outside the lattice) and LSE."""
    shape = tf.shape(x)
    frames, u1 = shape[1], shape[2]
    next_label = next_labels(labels, label_lengths, u1)
    index = tf.stack([tf.fill(tf.shape(next_label), blank), next_label], axis=-1)  # [B, U+1, 2]
    index = tf.broadcast_to(index[:, None], [shape[0], frames, u1, 2])
    picked = tf.gather(x, index, batch_dims=3)  # [B, T, U+1, 2]
    lse = tf.reduce_logsumexp(x, axis=-1) if fused else None
    if fused:
        picked = picked - lse[..., None]
    log_blank, log_label = mask_emissions(
        picked[..., 0], picked[..., 1], logit_lengths, label_lengths, delay
    )
    return log_blank, log_label, next_label, lse


def _rnnt_loss_with_grad(
    logits, labels, logit_lengths, label_lengths, blank, fused, delay, fastemit=0.0
):
    @tf.custom_gradient
    def core(logits):
        # stop_gradient: the tape must not differentiate through the compiled forward.
        x = tf.stop_gradient(logits)
        saved = _forward(x, labels, logit_lengths, label_lengths, blank, fused, delay)

        def grad(upstream):
            # Fresh copies made in the gradient's own graph: inside a tf.cond branch (the
            # TDT loss' omega draw) the compiled backward cannot capture the forward
            # branch's tensors itself ("Could not find external tensor capture").
            here = tf.nest.map_structure(lambda t: None if t is None else tf.identity(t), saved)
            return _backward(tf.identity(x), upstream, here, blank, fused, 1.0 + fastemit)

        return -(1.0 + fastemit) * saved.log_prob, grad

    return core(logits)


def _forward(logits, labels, logit_lengths, label_lengths, blank, fused, delay=0.0):
    x = tf.cast(logits, tf.float32)
    log_blank, log_label, next_label, lse = _emission_log_probs(
        x, labels, logit_lengths, label_lengths, blank, fused, delay
    )
    alpha, beta, blank_d, label_d, terminal, log_prob = forward_backward(
        log_blank, log_label, logit_lengths, label_lengths
    )
    return Lattice(log_prob, lse, next_label, alpha, beta, blank_d, label_d, terminal)


# XLA-compiled even when the caller is not: XLA writes the scatter into the dense softmax
# buffer in place, where TensorFlow's TensorScatterSub kernel copies it (2x the logits), and
# fuses the whole [B, T, U+1, V] expression into one pass. It holds no loop, so compiling
# it for a new shape is cheap.
@functools.partial(tf.function, jit_compile=True, reduce_retracing=True, autograph=False)
def _backward(logits, upstream, saved: Lattice, blank, fused, label_scale=1.0):
    """d(Σ_b upstream_b · loss_b)/d logits = upstream_b · (softmax · occupancy − posteriors)."""
    post_blank, post_label = posteriors(saved, upstream, tf.shape(logits)[1], label_scale)
    x = tf.cast(logits, tf.float32)
    shape = tf.shape(x)
    vocab = shape[3]
    cells = shape[0] * shape[1] * shape[2]
    if fused:
        occupancy = post_blank + post_label
        dense = tf.exp(x - saved.lse[..., None]) * occupancy[..., None]
    else:
        dense = tf.zeros_like(x)
    label_col = tf.broadcast_to(saved.next_label[:, None, :], tf.shape(post_label))
    rows = tf.range(cells)
    index = tf.concat(
        [
            tf.stack([rows, tf.fill([cells], blank)], axis=1),
            tf.stack([rows, tf.reshape(label_col, [cells])], axis=1),
        ],
        axis=0,
    )
    updates = tf.concat([tf.reshape(post_blank, [cells]), tf.reshape(post_label, [cells])], 0)
    flat = tf.tensor_scatter_nd_sub(tf.reshape(dense, [cells, vocab]), index, updates)
    return tf.cast(tf.reshape(flat, shape), logits.dtype)


@keras.saving.register_keras_serializable(package="asrkit")
class RNNTLoss:
    """Keras-friendly RNN-T loss with a documented reduction.

    `RNNTLoss(reduction=...)(logits, labels, logit_lengths, label_lengths)`:

    * ``"none"``: per-utterance losses, [B];
    * ``"sum"``: sum over utterances (what gradient accumulation wants: divide by the
      window's total count yourself);
    * ``"mean_utterances"``: sum / B;
    * ``"mean_tokens"``: sum / Σ label_lengths (a batch with no tokens divides by 1).
    """

    def __init__(
        self, *, blank: int = 0, reduction: str = "mean_utterances", fused_log_softmax: bool = True
    ):
        if reduction not in REDUCTIONS:
            raise ValueError(f"RNNTLoss: reduction must be one of {REDUCTIONS}, got {reduction!r}")
        self.blank = int(blank)
        self.reduction = reduction
        self.fused_log_softmax = bool(fused_log_softmax)

    def __call__(self, logits, labels, logit_lengths, label_lengths) -> tf.Tensor:
        losses = rnnt_loss(
            logits,
            labels,
            logit_lengths,
            label_lengths,
            blank=self.blank,
            fused_log_softmax=self.fused_log_softmax,
        )
        if self.reduction == "none":
            return losses
        total = tf.reduce_sum(losses)
        if self.reduction == "sum":
            return total
        if self.reduction == "mean_utterances":
            return total / tf.cast(tf.maximum(tf.size(losses), 1), tf.float32)
        tokens = tf.reduce_sum(tf.cast(label_lengths, tf.float32))
        return total / tf.maximum(tokens, 1.0)

    def get_config(self) -> dict:
        return {
            "blank": self.blank,
            "reduction": self.reduction,
            "fused_log_softmax": self.fused_log_softmax,
        }

    @classmethod
    def from_config(cls, config: dict) -> RNNTLoss:
        return cls(**config)
