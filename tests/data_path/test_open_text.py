"""Open-vocabulary text: WordNet's examples read from its data files, and the held-out split
checked by brute force on a WordNet-format directory these tests write (their own words)."""

import random
from pathlib import Path

import pytest

from asrkit.data.open_text import (
    TextSourceMissing,
    oov_share,
    proper_nouns,
    split_open_text,
    wordnet_sentences,
)

NAMES = ["Arlington", "Bexley", "Corvina", "Dunmore", "Elsworth", "Farrow", "Gaskell", "Hollis",
         "Ilford", "Jarrow", "Kendal", "Lowther"]  # fmt: skip


def _fake_wordnet(directory: Path, seed: int = 0) -> list[str]:
    """Four data files in WordNet's line format (a licence header, then synsets whose glosses
    quote examples): 600 sentences over a Zipf-like vocabulary, some saying a name, plus
    examples the reader must leave out. Returns the sentences it must keep, upper case."""
    rng = random.Random(seed)
    vocabulary = [f"w{chr(97 + i % 26)}{chr(97 + i // 26 % 26)}x" for i in range(400)]
    kept = []
    lines = {pos: ["  1 This software and database is being provided ... \"AS IS\"\n"]
             for pos in ("noun", "verb", "adj", "adv")}  # fmt: skip
    for k in range(600):
        words = [vocabulary[min(int(rng.paretovariate(1.0)) - 1, 399)]
                 for _ in range(rng.randint(4, 10))]  # fmt: skip
        if k % 9 == 0:
            words.insert(rng.randrange(1, len(words)), rng.choice(NAMES))
        text = " ".join(words)
        kept.append(text.upper())
        gloss = f'a gloss; "{text[0].upper()}{text[1:]}"; "1999 was a year"; "too short"'
        pos = ("noun", "verb", "adj", "adv")[k % 4]
        lines[pos].append(f"{k:08d} 03 n 01 thing 0 000 | {gloss}\n")
    for pos, content in lines.items():
        (directory / f"data.{pos}").write_text("".join(content), encoding="latin-1")
    return list(dict.fromkeys(kept))


def test_the_reader_keeps_plain_sentences_once_and_nothing_else(tmp_path):
    want = _fake_wordnet(tmp_path)
    got = wordnet_sentences(tmp_path)
    assert sorted(s.text for s in got) == sorted(want)
    assert all(s.text == " ".join(w.upper() for w in s.words) for s in got)


def test_a_missing_wordnet_names_the_package(tmp_path):
    with pytest.raises(TextSourceMissing, match="apt-get install wordnet-base"):
        wordnet_sentences(tmp_path / "nowhere")


@pytest.mark.parametrize("seed", [0, 1])
def test_held_out_names_and_words_never_reach_training(tmp_path, seed):
    _fake_wordnet(tmp_path)
    sentences = wordnet_sentences(tmp_path)
    dictionary = tmp_path / "words"
    dictionary.write_text("\n".join([*NAMES, "Thing"]) + "\n")
    names = proper_nouns(sentences, dictionary)
    assert names == {n.upper() for n in NAMES}
    split = split_open_text(sentences, names, seed, dev=40, test=50, held_out_names=6)
    train_words = {w for t in split.train for w in t.split()}
    assert len(split.dev) == 40 and len(split.test) == 50
    assert not set(split.train) & (set(split.dev) | set(split.test))
    assert not set(split.dev) & set(split.test)
    assert set(split.train) | set(split.dev) | set(split.test) <= {s.text for s in sentences}
    # the names said in dev and test, and the held-out rare words, are never in training
    assert split.names and not set(split.names) & train_words
    assert split.held_out_words and not set(split.held_out_words) & train_words
    said = [t for t in split.test if set(t.split()) & set(split.names)]
    assert len(said) >= 5
    # the OOV share, by brute force
    test_words = [w for t in split.test for w in t.split()]
    brute = sum(1 for w in test_words if w not in train_words) / len(test_words)
    assert oov_share(split.test, split.train) == pytest.approx(brute)
    assert brute > 0.05
    # one seed, one split
    again = split_open_text(sentences, names, seed, dev=40, test=50, held_out_names=6)
    assert again == split


@pytest.mark.slow
@pytest.mark.skipif(not Path("/usr/share/wordnet/data.noun").is_file(),
                    reason="Debian's wordnet-base is not installed")  # fmt: skip
def test_the_open_tiny_corpus_speaks_its_split_and_reports_it(tmp_path):
    """The corpus' transcripts are the split's sentences, its TEXT.json reports the OOV
    share of dev and test against the training transcripts, and lm.txt shares no sentence
    with any transcript."""
    import json

    from asrkit.data.synthetic import make_synthetic_corpus

    make_synthetic_corpus(tmp_path, "open-tiny", seed=0, show_progress=False)
    parts = {}
    for part in ("train-clean-100", "dev-clean", "test-clean"):
        lines = [line.split(" ", 1)[1] for f in (tmp_path / part).rglob("*.trans.txt")
                 for line in f.read_text().splitlines()]  # fmt: skip
        parts[part] = lines
    report = json.loads((tmp_path / "TEXT.json").read_text())
    for part in ("dev-clean", "test-clean"):
        assert report["oov_share"][part] == round(
            oov_share(parts[part], parts["train-clean-100"]), 4
        )
    lm = set((tmp_path / "lm.txt").read_text().splitlines())
    assert lm and not lm & {t for texts in parts.values() for t in texts}
    names = (tmp_path / "names.txt").read_text().split()
    assert set(names) <= {w for t in parts["dev-clean"] + parts["test-clean"] for w in t.split()}


def _spoken(root: Path) -> dict[str, list[str]]:
    return {part: sorted(line.split(" ", 1)[1] for f in (root / part).rglob("*.trans.txt")
                         for line in f.read_text().splitlines())
            for part in ("train-clean-100", "dev-clean", "test-clean")}  # fmt: skip


@pytest.mark.slow
@pytest.mark.skipif(not Path("/usr/share/wordnet/data.noun").is_file(),
                    reason="Debian's wordnet-base is not installed")  # fmt: skip
def test_an_adaptation_corpus_speaks_new_sentences_in_its_bases_test_voices(tmp_path, monkeypatch):
    """A preset that adapts another (open-voices adapts open; here a tiny one adapting
    open-tiny, same seed): every part is spoken by the base's test voices only, its test
    sentences are the base's, and what it trains and tunes on is said nowhere in the base
    corpus."""
    from asrkit.data import synthetic
    from asrkit.data.synthetic import PRESETS, Preset, make_synthetic_corpus, split_identities
    from asrkit.data.tts import available_voices

    monkeypatch.setitem(PRESETS, "open-tiny-voices", Preset(
        utterances=(6, 3, 4), speakers=(2, 2, 2), text="wordnet", adapts="open-tiny"))  # fmt: skip
    monkeypatch.setitem(PRESETS, "open-tiny-seen", Preset(
        utterances=(0, 0, 4), speakers=(0, 0, 2), text="wordnet", adapts="open-tiny",
        voices="train-clean-100"))  # fmt: skip
    assert synthetic.PRESETS["open-voices"].adapts == "open"
    made = make_synthetic_corpus(tmp_path / "base", "open-tiny", seed=3, show_progress=False)
    adapting = make_synthetic_corpus(tmp_path / "adapt", "open-tiny-voices", seed=3,
                                     show_progress=False)  # fmt: skip
    base, adapt = _spoken(tmp_path / "base"), _spoken(tmp_path / "adapt")
    held_out = split_identities(available_voices("en"), random.Random(3))["test-clean"]
    for part in ("train-clean-100", "dev-clean", "test-clean"):
        assert set(adapting.voices[part]) <= {v.identity for v in held_out}, part
        assert not set(adapting.voices[part]) & set(made.voices["train-clean-100"]), part
    assert adapt["test-clean"] == base["test-clean"]
    said = {t for texts in base.values() for t in texts}
    new = set(adapt["train-clean-100"] + adapt["dev-clean"])
    assert len(new) == 9 and not new & said
    assert not set((tmp_path / "adapt/lm.txt").read_text().splitlines()) & (said | new)
    # the base's training voices saying its test sentences: what adapting forgets
    seen = make_synthetic_corpus(tmp_path / "seen", "open-tiny-seen", seed=3, show_progress=False)
    assert _spoken(tmp_path / "seen")["test-clean"] == base["test-clean"]
    pool = split_identities(available_voices("en"), random.Random(3))["train-clean-100"]
    assert set(seen.voices["test-clean"]) <= {v.identity for v in pool}
