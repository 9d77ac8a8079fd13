"""Losses: the native TensorFlow RNN-Transducer loss."""

from asrkit.losses.rnnt import REDUCTIONS, RNNTLoss, rnnt_loss

__all__ = ["REDUCTIONS", "RNNTLoss", "rnnt_loss"]
