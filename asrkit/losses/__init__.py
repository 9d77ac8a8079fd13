"""Losses: the native TensorFlow RNN-Transducer loss, the joint's output layer fused with
it (chunked, recomputed in the backward pass), k2's pruned RNN-T loss, the TDT loss (plain
and fused) and an auxiliary CTC loss on the encoder."""

from asrkit.losses.ctc import ctc_losses
from asrkit.losses.fused import fused_joint_rnnt_loss
from asrkit.losses.pruned import (
    fused_simple_loss,
    loss_scales,
    prune_ranges,
    pruned_loss,
    simple_loss,
)
from asrkit.losses.rnnt import REDUCTIONS, RNNTLoss, rnnt_loss
from asrkit.losses.tdt import fused_tdt_loss, tdt_loss

__all__ = [
    "REDUCTIONS", "RNNTLoss", "ctc_losses", "fused_joint_rnnt_loss", "fused_simple_loss",
    "fused_tdt_loss", "loss_scales", "prune_ranges", "pruned_loss", "rnnt_loss", "simple_loss",
    "tdt_loss",
]  # fmt: skip
