"""Decoding: batched greedy and modified beam search for RNN-T and TDT models (graph
mode), streaming, words and their times, long files; typed results."""

from asrkit.decoding.search import (
    DecodeOptions,
    Hypothesis,
    beam_decode,
    decode_batch,
    greedy_decode,
)

__all__ = ["DecodeOptions", "Hypothesis", "beam_decode", "decode_batch", "greedy_decode"]
