"""Scores a search adds to its own: word boosting and n-gram LM fusion as token automata.

Each source of extra score is a deterministic automaton over the model's pieces: from a
state, a token leads to a next state and earns a score (log-probability units, weights
already applied); ending in a state earns a final score. Blank never moves an automaton
and earns nothing. A phrase list (`asrkit.decoding.fusion.boosting`) and an n-gram LM
(`asrkit.decoding.fusion.lm`) are both of this form, so a search takes any number of
them at once as one `FusionTables`: the automata's rows one after another, and a
hypothesis holds one state per automaton ([..., A] state indices into the shared rows).
A hypothesis's extra score is the sum of what its automata earned. Equal token sequences
are in equal states, so a beam search that merges them keeps the states right.

The tables are built here in NumPy (no TensorFlow: a command reads and checks them before
any model loads); `asrkit.decoding.fusion.steps` steps them inside a search.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from asrkit.errors import InputError
from asrkit.tokenizer import BLANK_ID

MAX_TABLE_ENTRIES = 2**26  # states x vocabulary, all automata: 512 MiB of tables at most


class Automaton(NamedTuple):
    """One automaton: state `start` before any token."""

    next_state: np.ndarray  # [S, V] int32
    bonus: np.ndarray  # [S, V] float32: what the step from a state by a token earns (may be < 0)
    final: np.ndarray  # [S] float32: what ending in a state earns
    start: int = 0


class FusionTables(NamedTuple):
    """Automata stacked: rows of all states, and where each automaton starts."""

    start: np.ndarray  # [A] int32: each automaton's first state (a row)
    next_state: np.ndarray  # [S, V] int32: rows, the targets already offset
    bonus: np.ndarray  # [S, V] float32
    final: np.ndarray  # [S] float32


def combine(*automata: Automaton) -> FusionTables:
    """`automata` (at least one, all over one vocabulary) as the tables a search takes."""
    if not automata:
        raise ValueError("combine needs at least one automaton")
    sizes = [len(a.final) for a in automata]
    vocab = {a.next_state.shape[1] for a in automata}
    if len(vocab) != 1:
        raise ValueError(f"automata over different vocabularies: {sorted(vocab)}")
    if sum(sizes) * vocab.pop() > MAX_TABLE_ENTRIES:
        raise InputError(
            f"the boosting and LM tables would hold {sum(sizes)} states; with this model's "
            f"pieces that exceeds {MAX_TABLE_ENTRIES:,} entries: boost fewer phrases or use "
            "a smaller (lower order, pruned) LM"
        )
    offsets = np.cumsum([0, *sizes[:-1]])
    return FusionTables(
        start=np.array([o + a.start for o, a in zip(offsets, automata, strict=True)], np.int32),
        next_state=np.concatenate(
            [a.next_state + np.int32(o) for o, a in zip(offsets, automata, strict=True)]
        ).astype(np.int32),
        bonus=np.concatenate([a.bonus for a in automata]).astype(np.float32),
        final=np.concatenate([a.final for a in automata]).astype(np.float32),
    )


def blank_free(next_state: np.ndarray, bonus: np.ndarray) -> None:
    """Makes blank keep every state and earn nothing (in place)."""
    next_state[:, BLANK_ID] = np.arange(len(next_state))
    bonus[:, BLANK_ID] = 0.0
