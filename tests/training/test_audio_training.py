"""Training on audio shards (features computed as they are read, a speed drawn per
utterance per epoch): it learns, a run resumed from a mid-epoch checkpoint ends with the
uninterrupted run's weights, and one update from N micro-batches is their union's."""

import json
import os
import shutil

import numpy as np
import pytest

from asrkit.checkpoints import CheckpointManager
from asrkit.config import load_config
from asrkit.data.records import write_shards
from asrkit.tokenizer import Tokenizer
from asrkit.training.trainer import train
from asrkit.training.verify import verify_accumulation
from tests.training.conftest import make_tiny_corpus
from tests.training.test_trainer import CONFIG, _weights


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


def _train(work, exp, log=lambda *_: None):
    cwd = os.getcwd()
    os.chdir(work)
    try:
        return train(load_config(work / "conf.yaml"), exp, log=log)
    finally:
        os.chdir(cwd)


def test_training_on_audio_shards_learns_and_resumes_identically(work):
    lines = []
    result = _train(work, work / "exp_a", log=lines.append)
    losses = result.epoch_losses
    assert len(losses) == 3 and losses[-1] < losses[0] * 0.8
    assert result.dev_wer is not None
    assert any("at the slowest speed" in line for line in lines)
    assert any("1 utterance(s) were left out at extraction" in line and "lost-1" in line
               for line in lines)  # fmt: skip
    resumed = work / "exp_b"
    shutil.copytree(work / "exp_a", resumed)
    checkpoints = CheckpointManager(resumed / "checkpoints").checkpoints()
    for later in checkpoints[len(checkpoints) // 2 + 1 :]:
        shutil.rmtree(later)
    _train(work, resumed)
    a = _weights(CheckpointManager(work / "exp_a" / "checkpoints").latest())
    b = _weights(CheckpointManager(resumed / "checkpoints").latest())
    assert a.keys() == b.keys() and len(a) > 5
    for name in a:
        np.testing.assert_array_equal(a[name], b[name], err_msg=name)


def test_one_update_from_audio_micro_batches_is_their_unions(work):
    cwd = os.getcwd()
    os.chdir(work)
    try:
        report = verify_accumulation(load_config(work / "conf.yaml"), steps=3)
    finally:
        os.chdir(cwd)
    assert report.passed and report.max_relative_difference < 1e-5
    assert len(report.micro_batch_sizes) == 3
