"""Decoding: batched greedy and modified beam search for RNN-T and TDT models (graph
mode), streaming, words and their times, long files; typed results.

Three parts: `search/` (the searches and the table of decoding strategies), `fusion/` (word
boosting and LM fusion), and the rest here: the recogniser that runs them on audio
(`recogniser`), transcripts of files, test sets, streams, and their formats.

The names below are imported on first use, so that the NumPy-only modules here (phrase
lists, LM tables) load without TensorFlow: a command checks its inputs in its first second.
"""

import importlib

__all__ = ["DecodeOptions", "Hypothesis", "beam_decode", "decode_batch", "greedy_decode"]


def __getattr__(name: str):
    if name in __all__:
        return getattr(importlib.import_module("asrkit.decoding.search.front"), name)
    raise AttributeError(f"module 'asrkit.decoding' has no attribute {name!r}")
