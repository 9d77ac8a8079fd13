"""Losses: the native TensorFlow RNN-Transducer loss, k2's pruned RNN-T loss (its simple
and pruned parts), the TDT loss and an auxiliary CTC loss on the encoder.

One convention throughout: the data tensors (logits or the joint's projections, labels,
logit_lengths, label_lengths) are positional, every setting is a keyword. Each loss that
evaluates the joint's output layer itself has a `fused_` twin that takes that layer's
`kernel=` and `bias=` and evaluates it chunk by chunk (never the whole [B, T, U+1, V] or
[B, T, S, V]), recomputed in the backward pass: the same losses and gradients (tested)."""

from asrkit.losses.ctc import ctc_losses
from asrkit.losses.fused import fused_rnnt_loss
from asrkit.losses.pruned import (
    fused_pruned_loss,
    fused_simple_loss,
    loss_scales,
    prune_ranges,
    pruned_loss,
    simple_loss,
)
from asrkit.losses.rnnt import REDUCTIONS, RNNTLoss, rnnt_loss
from asrkit.losses.tdt import fused_tdt_loss, tdt_loss

__all__ = [
    "REDUCTIONS", "RNNTLoss", "ctc_losses", "fused_pruned_loss", "fused_rnnt_loss",
    "fused_simple_loss", "fused_tdt_loss", "loss_scales", "prune_ranges", "pruned_loss",
    "rnnt_loss", "simple_loss", "tdt_loss",
]  # fmt: skip
