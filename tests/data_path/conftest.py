"""The tiny synthetic corpus the data-path tests share."""

import pytest

from asrkit.data.librispeech import prepare_librispeech
from asrkit.data.manifest import read_manifest
from asrkit.data.synthetic import make_synthetic_corpus
from asrkit.tokenizer import train_tokenizer


def tiny_corpus(work, seed: int, vocab: int):
    """(its train-clean-100.jsonl, a character tokenizer of `vocab` in work/tok): the tiny
    synthetic corpus of `seed` in `work`."""
    make_synthetic_corpus(work / "corpus", "tiny", seed=seed, show_progress=False)
    prepare_librispeech(work / "corpus", ["train-clean-100"], work, show_progress=False)
    manifest = work / "train-clean-100.jsonl"
    texts = [u.text for u in read_manifest(manifest)]
    return manifest, train_tokenizer(texts * 3, work / "tok", vocab, "char")


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """(work directory, its manifest, its tokenizer), one per test module."""
    work = tmp_path_factory.mktemp("corpus")
    return work, *tiny_corpus(work, seed=7, vocab=30)
