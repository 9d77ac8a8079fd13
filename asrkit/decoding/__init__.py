"""Decoding: batched greedy search (graph mode) and typed results."""

from asrkit.decoding.greedy import Hypothesis, greedy_decode, greedy_search

__all__ = ["Hypothesis", "greedy_decode", "greedy_search"]
