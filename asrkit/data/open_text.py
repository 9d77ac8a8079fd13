"""Open-vocabulary English text for a synthetic corpus, from what Debian's packages install.

The sentences are WordNet 3.0's usage examples (Debian's `wordnet-base`, Princeton's licence:
use, copy and distribute with its copyright notice kept, which the corpus' TEXT.json quotes):
about 34 thousand sentences of real English over 27 thousand words once those with digits,
symbols or fewer than four words are left out. The proper nouns among their words are the
capitalised entries of the system dictionary (`wamerican`'s /usr/share/dict/words) that a
sentence writes capitalised after its first word.

The split holds out by construction:
- names: a seeded set of proper nouns; every sentence saying one is kept from training, and
  dev and test draw some of their sentences from those (the names said, for word boosting);
- out-of-vocabulary words: a seeded set of rare words held out the same way, so that the dev
  and test sentences hold words the training text never has (their share is measured, not
  assumed: `oov_share`);
- every dev and test sentence is absent from the training text, and dev and test share none.
The training pool is every other sentence; the sentences of it that a corpus does not speak
are text for an LM disjoint from the training transcripts.
"""

from __future__ import annotations

import random
import re
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from asrkit.errors import UserError

WORDNET_DIR = Path("/usr/share/wordnet")
DICTIONARY = Path("/usr/share/dict/words")
WORDNET_NOTICE = "WordNet 3.0 Copyright 2006 by Princeton University. All rights reserved."
_WORD = re.compile(r"[A-Za-z]+(?:'[A-Za-z]+)?")
_REFUSED = re.compile(r"[0-9&/%$#@()\[\]_*+=<>|\\~^`]")


class TextSourceMissing(UserError):
    """The package a text source reads is not installed."""


@dataclass(frozen=True)
class Sentence:
    text: str  # upper case, words separated by single spaces
    words: tuple[str, ...]  # as written (case kept: proper nouns)


@dataclass(frozen=True)
class TextSplit:
    train: tuple[str, ...]  # the training pool, shuffled
    dev: tuple[str, ...]
    test: tuple[str, ...]
    names: tuple[str, ...]  # held-out proper nouns said in dev or test, upper case
    held_out_words: tuple[str, ...]  # held-out rare words, upper case


def wordnet_sentences(directory: Path = WORDNET_DIR) -> list[Sentence]:
    """WordNet's usage examples (the quoted parts of its glosses) that are plain sentences:
    4 to 18 words of letters (an apostrophe inside a word kept), no digits or symbols;
    punctuation between words dropped; each text once."""
    files = [directory / f"data.{pos}" for pos in ("noun", "verb", "adj", "adv")]
    missing = [str(f) for f in files if not f.is_file()]
    if missing:
        raise TextSourceMissing(
            f"{missing[0]}: WordNet's data is not installed; install Debian's wordnet-base "
            "(apt-get install wordnet-base), or point at a directory holding data.noun, "
            "data.verb, data.adj and data.adv"
        )
    seen: dict[str, Sentence] = {}
    for path in files:
        with path.open(encoding="latin-1") as f:
            for line in f:
                if line.startswith("  ") or " | " not in line:  # the licence header
                    continue
                for quoted in re.findall(r'"([^"]+)"', line.split(" | ", 1)[1]):
                    sentence = _sentence(quoted)
                    if sentence is not None:
                        seen.setdefault(sentence.text, sentence)
    return list(seen.values())


def _sentence(quoted: str) -> Sentence | None:
    if _REFUSED.search(quoted):
        return None
    words = re.sub(r"[,;:!?.\"\u2014-]+", " ", quoted).split()
    if not 4 <= len(words) <= 18 or not all(_WORD.fullmatch(w) for w in words):
        return None
    return Sentence(" ".join(w.upper() for w in words), tuple(words))


def proper_nouns(sentences: list[Sentence], dictionary: Path = DICTIONARY) -> set[str]:
    """Upper-case words that a sentence writes capitalised after its first word and that the
    dictionary lists capitalised (names of people, places, peoples, ...); without a
    dictionary, every such word."""
    written = {w for s in sentences for w in s.words[1:] if w[:1].isupper() and w != "I"}
    written = {w for w in written if not w.isupper() and len(w) >= 3}  # not TV, U, Dr
    if dictionary.is_file():
        listed = set(dictionary.read_text(encoding="utf-8", errors="replace").split())
        written &= listed
    return {w.upper() for w in written}


def split_open_text(
    sentences: list[Sentence],
    names: set[str],
    seed: int,
    dev: int,
    test: int,
    held_out_names: int = 120,
    name_share: float = 0.2,
    rare_share: float = 0.1,
) -> TextSplit:
    """Held-out dev and test sentences, and the training pool (see the module's doc). Names
    said in 1 to 8 sentences are candidates (common ones, e.g. ENGLISH, stay in training);
    `held_out_names` of them are held out, and `name_share` of dev and test say one. Words
    said once or twice (not names) are the rare words: enough of them are held out that
    `rare_share` of dev and test are sentences holding one; the rest of dev and test are
    drawn from the training pool's sentences (then taken out of it)."""
    rng = random.Random(seed)
    sentences = sorted(sentences, key=lambda s: s.text)
    counts = Counter(w for s in sentences for w in set(s.text.split()))
    candidates = sorted(n for n in names if 1 <= counts[n] <= 8)
    rng.shuffle(candidates)
    chosen_names = set(candidates[:held_out_names])
    rare = sorted(w for w, c in counts.items() if c <= 2 and w not in names)
    rng.shuffle(rare)
    parts = {"dev": dev, "test": test}
    want_named = {p: round(n * name_share) for p, n in parts.items()}
    want_rare = {p: round(n * rare_share) for p, n in parts.items()}
    named = [s for s in sentences if chosen_names & set(s.text.split())]
    rng.shuffle(named)
    # rare words are held out one at a time until their sentences fill dev and test
    held_rare: set[str] = set()
    rare_pool: list[Sentence] = []
    taken = {s.text for s in named}
    by_word: dict[str, list[Sentence]] = {}
    for s in sentences:
        for w in set(s.text.split()) & set(rare):
            by_word.setdefault(w, []).append(s)
    for word in rare:
        if len(rare_pool) >= sum(want_rare.values()):
            break
        fresh = [s for s in by_word.get(word, []) if s.text not in taken]
        if fresh:
            held_rare.add(word)
            rare_pool += fresh
            taken.update(s.text for s in fresh)
    held = chosen_names | held_rare
    pool = [s for s in sentences if not held & set(s.text.split())]
    rng.shuffle(pool)
    out: dict[str, list[str]] = {}
    for part in parts:
        picked = [s.text for s in named[: want_named[part]]]
        named = named[want_named[part] :]
        picked += [s.text for s in rare_pool[: want_rare[part]]]
        rare_pool = rare_pool[want_rare[part] :]
        rest = parts[part] - len(picked)
        picked += [s.text for s in pool[:rest]]
        pool = pool[rest:]
        rng.shuffle(picked)
        out[part] = picked
    said = {w for part in out.values() for text in part for w in text.split()}
    # Held-out sentences not picked are left out of the training pool as well.
    return TextSplit(
        train=tuple(s.text for s in pool), dev=tuple(out["dev"]), test=tuple(out["test"]),
        names=tuple(sorted(chosen_names & said)), held_out_words=tuple(sorted(held_rare)),
    )  # fmt: skip


def oov_share(texts: list[str] | tuple[str, ...], training: list[str] | tuple[str, ...]) -> float:
    """The share of the words of `texts` that no training text holds."""
    known = {w for text in training for w in text.split()}
    words = [w for text in texts for w in text.split()]
    return sum(w not in known for w in words) / max(len(words), 1)
