"""The tiny synthetic corpus (tokenizer + train/dev shards) the training tests share."""

from pathlib import Path

import pytest

from asrkit.data.librispeech import prepare_librispeech
from asrkit.data.manifest import read_manifest
from asrkit.data.records import write_shards
from asrkit.data.synthetic import make_synthetic_corpus
from asrkit.tokenizer import train_tokenizer


def make_tiny_corpus(work: Path) -> Path:
    make_synthetic_corpus(work / "corpus", "tiny", seed=2, show_progress=False)
    parts = ["train-clean-100", "dev-clean"]
    prepare_librispeech(work / "corpus", parts, work / "data", show_progress=False)
    texts = [u.text for u in read_manifest(work / "data" / "train-clean-100.jsonl")]
    tok = train_tokenizer(texts * 3, work / "tokenizer", 28, "char")
    for part, name in zip(parts, ["train", "dev"], strict=True):
        write_shards(work / "data" / f"{part}.jsonl", tok, work / "shards" / name,
                     num_shards=2, show_progress=False, allow_unknown=name == "dev")  # fmt: skip
    return work


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    """A fresh copy per test module: `tokenizer/`, `shards/train`, `shards/dev`."""
    return make_tiny_corpus(tmp_path_factory.mktemp("tiny"))
