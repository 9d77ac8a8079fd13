"""Decoding: batched greedy and modified beam search for RNN-T and TDT models (graph
mode), streaming, words and their times, long files; typed results.

The names below are imported on first use, so that the NumPy-only modules here (phrase
lists, LM tables) load without TensorFlow: a command checks its inputs in its first second.
"""

import importlib

__all__ = ["DecodeOptions", "Hypothesis", "beam_decode", "decode_batch", "greedy_decode"]


def __getattr__(name: str):
    if name in __all__:
        return getattr(importlib.import_module("asrkit.decoding.search"), name)
    raise AttributeError(f"module 'asrkit.decoding' has no attribute {name!r}")
