"""Word boosting (context biasing): phrases a search favours, without retraining.

A phrase list becomes token sequences over the model's own pieces (the phrase as written
and as a sentence would start it, each in the tokenizer's few most likely segmentations),
and those a prefix tree with failure arcs (Aho-Corasick), held as a dense automaton: for
every state and token, the next state and the bonus the step earns.

The bonus is in log-probability units, `weight` per piece. A partial match earns its
pieces as they come; abandoning it takes them back (the step into the new state subtracts
them), and so does the end of the utterance. So a finished hypothesis has earned exactly
`weight x pieces` for every occurrence of a phrase in it (overlapping ones too), and a
boosted phrase cannot win on a prefix alone. While a phrase is still open its pieces
count: the running bonus of a prefix is what its finished occurrences earned plus the
pieces of its longest suffix that some phrase could still extend. Blank is never boosted
and never changes the state.
"""

from __future__ import annotations

import math
import warnings
from collections import deque
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from asrkit.config import DecodeConfig
from asrkit.decoding.fusion.tables import MAX_TABLE_ENTRIES, Automaton, blank_free
from asrkit.errors import InputError
from asrkit.tokenizer import BLANK_ID, UNK_ID

DEFAULT_WEIGHT = DecodeConfig.boost_weight  # per piece, in nats; defined there once
SEGMENTATIONS = 4  # a phrase's most likely segmentations boosted (unigram tokenizers)
# Per-piece weights from which boosting was measured to hallucinate (RESULTS.md, "Word
# boosting"): at 2, greedy search wrote fragments of boosted phrases into sentences without
# them (WER there 0.74 -> 26 %) and beam search kept hypotheses stopping inside a phrase.
HALLUCINATING_WEIGHT = 2.0


@dataclass(frozen=True)
class Phrase:
    text: str
    weight: float | None  # None: the list's default weight, filled in by the caller


def read_phrases(path: str | Path, weight: float | None = DEFAULT_WEIGHT) -> list[Phrase]:
    """A phrase list: one phrase per line, or `phrase<TAB>weight`; blank lines and lines
    starting with # are skipped (a list of none is no boosting). A bad weight or a missing
    file is named with its line. `weight`: a line's without its own (None: left for the
    caller to fill)."""
    path = Path(path)
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except FileNotFoundError:
        raise InputError(f"--boost {path}: no such phrase list") from None
    except UnicodeDecodeError as err:
        raise InputError(f"--boost {path}: not UTF-8 text ({err.reason})") from None
    phrases = []
    for number, line in enumerate(lines, 1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        text, tab, value = line.partition("\t")
        own = weight
        if tab:
            try:
                own = float(value)
            except ValueError:
                own = math.nan
            if not math.isfinite(own) or own < 0:
                raise InputError(
                    f"--boost {path}:{number}: weight {value.strip()!r} is not a number >= 0 "
                    "(a line is a phrase, or a phrase, a tab and its weight per piece)"
                )
        if not text.strip():
            raise InputError(f"--boost {path}:{number}: a weight without a phrase")
        phrases.append(Phrase(" ".join(text.split()), own))
    return phrases


def phrase_sequences(phrases: list[Phrase], tokenizer) -> dict[tuple[int, ...], float]:
    """Each phrase's token sequences -> its weight (the highest where two phrases share
    one): the phrase as written and with a capital first letter (a sentence's start;
    one variant for a lower-case model), each in the tokenizer's `SEGMENTATIONS` most
    likely segmentations. Phrases holding a character the model cannot emit are left out
    with one warning naming them."""
    out: dict[tuple[int, ...], float] = {}
    unusable, risky = [], []
    for phrase in phrases:
        if tokenizer.unknown(phrase.text):
            unusable.append(phrase.text)
            continue
        variants = dict.fromkeys([phrase.text, phrase.text[:1].upper() + phrase.text[1:]])
        pieces = []
        for variant in variants:
            for ids in tokenizer.segmentations(variant, SEGMENTATIONS):
                key = tuple(int(i) for i in ids)
                if key and UNK_ID not in key and BLANK_ID not in key:
                    out[key] = max(out.get(key, 0.0), phrase.weight)
                    pieces.append(len(key))
        if pieces and phrase.weight >= HALLUCINATING_WEIGHT:
            risky.append(f"{phrase.text!r} {phrase.weight:g} x {min(pieces)} pieces = "
                         f"{phrase.weight * min(pieces):g}")  # fmt: skip
    if risky:
        warnings.warn(
            f"{len(risky)} phrase(s) weighted {HALLUCINATING_WEIGHT:g} or more per piece, the "
            f"range where boosting writes phrases into speech without them (bonus in nats: "
            f"{', '.join(risky[:5])}); start at 0.5-1 and measure (docs/boosting.md)",
            stacklevel=2,
        )
    if unusable:
        warnings.warn(
            f"{len(unusable)} phrase(s) hold characters this model cannot emit and are not "
            f"boosted: {', '.join(repr(p) for p in unusable[:5])}",
            stacklevel=2,
        )
    return out


def boost_tables(sequences: dict[tuple[int, ...], float], vocab_size: int) -> Automaton:
    """The Aho-Corasick automaton of `sequences` (token ids -> weight per piece) over a
    vocabulary of `vocab_size` ids, as dense tables; state 0 is the root (nothing matched),
    and ending in a state takes back its open match (final <= 0)."""
    children: list[dict[int, int]] = [{}]
    piece: list[float] = [0.0]  # a node's piece bonus: the largest weight through it
    ending: list[bool] = [False]
    for sequence, weight in sequences.items():
        node = 0
        for token in sequence:
            if not 0 <= token < vocab_size or token == BLANK_ID:
                raise ValueError(f"token {token} outside the vocabulary (or blank)")
            if token not in children[node]:
                children[node][token] = len(children)
                children.append({})
                piece.append(0.0)
                ending.append(False)
            node = children[node][token]
            piece[node] = max(piece[node], weight)
        ending[node] = True
    states = len(children)
    if states * vocab_size > MAX_TABLE_ENTRIES:
        raise InputError(
            f"--boost: {len(sequences)} token sequences make {states} states; with "
            f"{vocab_size} pieces the tables would exceed {MAX_TABLE_ENTRIES:,} entries: "
            "boost fewer phrases"
        )
    score = np.zeros(states)  # a node's pieces, root to it
    output = np.zeros(states)  # what reaching it finishes: its own phrase and its suffixes'
    pending = np.zeros(states)  # the pieces of its longest suffix a phrase can extend
    next_state = np.zeros((states, vocab_size), np.int32)
    fail = [0] * states
    queue = deque([0])
    while queue:  # breadth first: a node's failure target is done before it
        node = queue.popleft()
        if node:
            output[node] = (score[node] if ending[node] else 0.0) + output[fail[node]]
            pending[node] = score[node] if children[node] else pending[fail[node]]
            next_state[node] = next_state[fail[node]]
        for token, child in children[node].items():
            score[child] = score[node] + piece[child]
            fail[child] = next_state[fail[node], token] if node else 0
            next_state[node, token] = child
            queue.append(child)
    bonus = output[next_state] + pending[next_state] - pending[:, None]
    blank_free(next_state, bonus)
    return Automaton(next_state, bonus.astype(np.float32), (-pending).astype(np.float32))


def no_boost(vocab_size: int) -> Automaton:
    """The automaton of no phrase: one state, no bonus."""
    return boost_tables({}, vocab_size)


def load_boost(path, tokenizer, vocab_size: int, weight: float = DEFAULT_WEIGHT) -> Automaton:
    """A phrase list file as its automaton (`asrkit.decoding.fusion.tables.combine` makes the
    tables a search takes)."""
    return boost_automaton(read_phrases(path, weight), path, tokenizer, vocab_size)


def boost_automaton(phrases: list[Phrase], path, tokenizer, vocab_size: int) -> Automaton:
    """Read phrases (of the list at `path`, named in messages) as their automaton."""
    if not phrases:
        warnings.warn(f"--boost {path}: no phrase in it; decoding without boosting", stacklevel=3)
        return no_boost(vocab_size)
    sequences = phrase_sequences(phrases, tokenizer)
    if not sequences:
        raise InputError(f"--boost {path}: none of its phrases can be written with this model")
    return boost_tables(sequences, vocab_size)
