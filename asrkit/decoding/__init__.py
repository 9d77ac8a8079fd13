"""Decoding: batched greedy and modified beam search (graph mode), typed results."""

from asrkit.decoding.search import (
    DecodeOptions,
    Hypothesis,
    beam_decode,
    decode_batch,
    greedy_decode,
)

__all__ = ["DecodeOptions", "Hypothesis", "beam_decode", "decode_batch", "greedy_decode"]
