"""PyTorch checkpoints read without torch: every value as torch saved it (fixtures made by
torch itself, tools/make_torch_fixtures.py), and a pickle that names code refused unrun."""

import os
import pickle
import zipfile
from pathlib import Path

import numpy as np
import pytest

from asrkit.importers.torch_checkpoint import CheckpointFormatError, read_torch_checkpoint

DATA = Path(__file__).resolve().parents[1] / "data" / "torch"


def test_every_tensor_is_read_as_torch_saved_it():
    got = read_torch_checkpoint(DATA / "state_dict.ckpt")
    want = dict(np.load(DATA / "state_dict.npz"))
    assert list(got) == list(want)  # the state dict's order
    for key, value in want.items():
        assert got[key].dtype == value.dtype, key
        assert got[key].shape == value.shape, key
        np.testing.assert_array_equal(got[key], value, err_msg=key)
    assert not np.shares_memory(got["transposed"], got["row"])  # copies, not views


def test_a_pickle_that_names_code_is_refused_without_running_it(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(CheckpointFormatError, match=r"names the global (posix|os)\.system"):
        read_torch_checkpoint(DATA / "malicious.ckpt")
    assert not (tmp_path / "asrkit-pwned").exists()

    # The refusal comes from the allowlist, not from that one name: eval too.
    class Eval:
        def __reduce__(self):
            return eval, ("1 + 1",)

    evil = tmp_path / "eval.ckpt"
    with zipfile.ZipFile(evil, "w") as archive:
        archive.writestr("e/data.pkl", pickle.dumps({"w": Eval()}, protocol=2))
    with pytest.raises(CheckpointFormatError, match=r"(__builtin__|builtins)\.eval"):
        read_torch_checkpoint(evil)


def test_truncated_and_foreign_files_name_the_file(tmp_path):
    data = (DATA / "state_dict.ckpt").read_bytes()
    truncated = tmp_path / "truncated.ckpt"
    truncated.write_bytes(data[: len(data) // 2])
    with pytest.raises(CheckpointFormatError, match=r"truncated\.ckpt"):
        read_torch_checkpoint(truncated)
    text = tmp_path / "notes.txt"
    text.write_text("not a checkpoint")
    with pytest.raises(CheckpointFormatError, match=r"notes\.txt: not a PyTorch checkpoint"):
        read_torch_checkpoint(text)
    short = tmp_path / "short.ckpt"  # a storage shorter than its tensor
    with zipfile.ZipFile(DATA / "state_dict.ckpt") as source, zipfile.ZipFile(short, "w") as out:
        for item in source.infolist():
            body = source.read(item)
            out.writestr(item, body[:4] if item.filename.endswith("/data/0") else body)
    with pytest.raises(CheckpointFormatError, match="truncated"):
        read_torch_checkpoint(short)
    assert os.listdir(tmp_path)  # nothing else is written
