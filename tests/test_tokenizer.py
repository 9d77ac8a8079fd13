"""SentencePiece tokenizer: blank id 0 never emitted, round trips, settings saved beside it."""

import json
import re

import pytest

from asrkit.cli.main import main as cli
from asrkit.data.manifest import Utterance, write_manifest
from asrkit.tokenizer import BLANK_ID, Tokenizer, train_tokenizer

TEXTS = [
    "THE QUICK BROWN FOX JUMPS OVER THE LAZY DOG",
    "SHE SELLS SEA SHELLS BY THE SEA SHORE",
    "HOW MUCH WOOD WOULD A WOODCHUCK CHUCK",
    "PETER PIPER PICKED A PECK OF PICKLED PEPPERS",
] * 5


@pytest.mark.parametrize("model_type,size", [("unigram", 40), ("bpe", 40), ("char", 30)])
def test_round_trip_and_blank(tmp_path, model_type, size):
    tok = train_tokenizer(TEXTS, tmp_path, size, model_type)
    assert tok.blank_id == BLANK_ID == 0 and tok.piece(0) == "<blank>"
    for text in TEXTS[:4]:
        ids = tok.encode(text)
        assert ids and BLANK_ID not in ids and max(ids) < tok.vocab_size
        assert tok.decode(ids) == text
        assert tok.decode([BLANK_ID, *ids, BLANK_ID]) == text  # blanks are dropped
    loaded = Tokenizer.load(tmp_path)
    assert loaded.encode(TEXTS[0]) == tok.encode(TEXTS[0])
    assert json.loads((tmp_path / "tokenizer.json").read_text())["model_type"] == model_type


def test_impossible_vocab_size_names_the_size_that_fits(tmp_path):
    """Too many pieces for the text: the error names the largest size that trains, in the
    option's words (SentencePiece's own message is an internal assertion)."""
    with pytest.raises(ValueError, match=r"--vocab-size 5000: .* at most (\d+) fit") as err:
        train_tokenizer(TEXTS, tmp_path / "a", 5000, "unigram")
    fits = int(re.search(r"at most (\d+) fit", str(err.value))[1])
    assert "INTERNAL" not in str(err.value)
    assert train_tokenizer(TEXTS, tmp_path / "b", fits, "unigram").vocab_size == fits
    with pytest.raises(ValueError, match=f"--vocab-size {fits + 1}: "):
        train_tokenizer(TEXTS, tmp_path / "c", fits + 1, "unigram")


def test_cli_trains_from_manifests(tmp_path, capsys):
    utts = [Utterance(f"u{i}", "/x.flac", 1.0, t, "s") for i, t in enumerate(TEXTS)]
    write_manifest(tmp_path / "train.jsonl", utts)
    args = ["tokenizer", "train", "--manifest", str(tmp_path / "train.jsonl")]
    assert cli([*args, "--vocab-size", "32", "--out", str(tmp_path / "tok")]) == 0
    assert "blank id 0" in capsys.readouterr().out
    assert Tokenizer.load(tmp_path / "tok").vocab_size == 32


def test_missing_settings_file_is_explained(tmp_path):
    with pytest.raises(FileNotFoundError, match="asrkit tokenizer train"):
        Tokenizer.load(tmp_path)


@pytest.mark.parametrize("model_type,size", [("unigram", 40), ("char", 30)])
def test_surface_pieces_joined_reproduce_decode(tmp_path, model_type, size):
    """The table an exported graph detokenises with: join, collapse spaces, upper-case."""
    import numpy as np

    tok = train_tokenizer(TEXTS, tmp_path, size, model_type)
    pieces = tok.surface_pieces()
    assert len(pieces) == tok.vocab_size and pieces[BLANK_ID] == ""
    rng = np.random.default_rng(0)
    for _ in range(50):
        ids = rng.integers(0, tok.vocab_size, size=rng.integers(0, 12)).tolist()
        joined = " ".join("".join(pieces[i] for i in ids).upper().split())
        assert joined == tok.decode(ids)


def test_unicode_case_and_punctuation_as_the_transcripts_have_them(tmp_path):
    """NFC on both sides; a cased tokenizer (--keep-case) keeps case and punctuation and
    decodes them; characters outside its pieces are reported, not silently lost."""
    texts = ["Grüß Gott, Jürgen!", "Café? Ja, das Café.", "Über alles."] * 5
    cased = train_tokenizer(texts, tmp_path / "cased", 30, "char", keep_case=True)
    assert not cased.settings.lower_case
    decomposed = "Gru\u0308ß Gott, Ju\u0308rgen!"  # ü as u + combining diaeresis
    assert cased.encode(decomposed) == cased.encode("Grüß Gott, Jürgen!")
    assert cased.decode(cased.encode("Über Café, Jürgen!")) == "Über Café, Jürgen!"
    assert cased.unknown("Grüß Gott, Jürgen!") == []
    assert cased.unknown("Zoë Grüß, Zoë") == ["Z", "ë", "Z", "ë"]
    lower = train_tokenizer(texts, tmp_path / "lower", 30, "char")
    assert lower.decode(lower.encode("über café")) == "ÜBER CAFÉ"
