"""Training on audio shards (features computed as they are read, a speed drawn per
utterance per epoch): it learns, a run resumed from a mid-epoch checkpoint ends with the
uninterrupted run's weights, and one update from N micro-batches is their union's."""

import json

import pytest

from asrkit.data.records import write_shards
from asrkit.tokenizer import Tokenizer
from tests.training.conftest import make_tiny_corpus
from tests.training.test_trainer import (
    CONFIG,
    _assert_ends_as_uninterrupted,
    _copy_up_to,
    _train_in,
    _verify,
)


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    work = make_tiny_corpus(tmp_path_factory.mktemp("audio_training"))
    tok = Tokenizer.load(work / "tokenizer")
    for part, name, speeds in (("train-clean-100", "train", (0.9, 1.0, 1.1)),
                               ("dev-clean", "dev", (1.0,))):  # fmt: skip
        write_shards(work / "data" / f"{part}.jsonl", tok, work / "audio" / name, num_shards=2,
                     speeds=speeds, store="audio", show_progress=False,
                     allow_unknown=name == "dev")  # fmt: skip
    index = work / "audio" / "train" / "shards.json"  # as if extraction had skipped one
    lost = {"lost-1": "lost.flac: no such audio file"}
    index.write_text(json.dumps({**json.loads(index.read_text()), "unreadable": lost}))
    text = CONFIG.replace("shards/train", "audio/train").replace("shards/dev", "audio/dev")
    (work / "conf.yaml").write_text(text)
    return work


def test_training_on_audio_shards_learns_and_resumes_identically(work):
    lines = []
    result = _train_in(work, work / "exp_a", log=lines.append)
    losses = result.epoch_losses
    assert len(losses) == 3 and losses[-1] < losses[0] * 0.8
    assert result.dev_wer is not None
    assert any("at the slowest speed" in line for line in lines)
    assert any("1 utterance(s) were left out at extraction" in line and "lost-1" in line
               for line in lines)  # fmt: skip
    resumed, checkpoints = _copy_up_to(work, "exp_b", 0)  # from its middle checkpoint
    assert len(checkpoints) > 2
    _train_in(work, resumed)
    _assert_ends_as_uninterrupted(work, resumed)


def test_one_update_from_audio_micro_batches_is_their_unions(work):
    report = _verify(work)  # 3 micro-batches
    assert report.passed and report.max_relative_difference < 1e-5
    assert len(report.micro_batch_sizes) == 3
