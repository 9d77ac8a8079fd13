"""A .nemo archive is read by member name, into memory: unsafe members refuse it whole,
damaged or incomplete ones are named, nothing is ever extracted."""

import io
import tarfile
from pathlib import Path

import numpy as np
import pytest

from asrkit.importers.nemo_archive import NemoArchiveError, read_nemo

DATA = Path(__file__).resolve().parents[1] / "data" / "torch"
CONFIG = b"tokenizer:\n  model: nemo:abc_tokenizer.model\nencoder:\n  d_model: 8\n"


def _nemo(path, members, mode="w:gz"):
    with tarfile.open(path, mode) as archive:
        for name, body, kind in members:
            info = tarfile.TarInfo(name)
            if kind == "file":
                info.size = len(body)
                archive.addfile(info, io.BytesIO(body))
            else:
                info.type = kind
                info.linkname = "/etc/passwd"
                archive.addfile(info)
    return path


def _good(tmp_path, mode="w:gz", extra=()):
    weights = (DATA / "state_dict.ckpt").read_bytes()
    return _nemo(tmp_path / "model.nemo", [
        ("./model_config.yaml", CONFIG, "file"),
        ("./model_weights.ckpt", weights, "file"),
        ("./abc_tokenizer.model", b"sentencepiece bytes", "file"),
        *extra,
    ], mode)  # fmt: skip


@pytest.mark.parametrize("mode", ["w:gz", "w"])
def test_a_nemo_archive_gives_its_config_weights_and_named_members(tmp_path, mode):
    nemo = read_nemo(_good(tmp_path, mode))
    assert nemo.config["encoder"]["d_model"] == 8
    want = np.load(DATA / "state_dict.npz")
    np.testing.assert_array_equal(nemo.weights["encoder.weight"], want["encoder.weight"])
    assert nemo.member(nemo.config["tokenizer"]["model"]) == b"sentencepiece bytes"
    with pytest.raises(NemoArchiveError, match=r"names nemo:missing\.model, not in the archive"):
        nemo.member("nemo:missing.model")


@pytest.mark.parametrize(
    ("member", "kind"),
    [("../escape.txt", "file"), ("/etc/cron.d/x", "file"), ("./link", tarfile.SYMTYPE),
     ("./hard", tarfile.LNKTYPE), ("./dev", tarfile.CHRTYPE)],
)  # fmt: skip
def test_unsafe_members_refuse_the_archive_whole(tmp_path, member, kind):
    path = _good(tmp_path, extra=[(member, b"x", kind)])
    with pytest.raises(NemoArchiveError, match="refused") as err:
        read_nemo(path)
    assert repr(member) in str(err.value)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.nemo"]  # nothing extracted


@pytest.mark.parametrize("mode", ["w:gz", "w"])  # a plain tar's weights are read in place
def test_damaged_and_incomplete_archives_are_named(tmp_path, mode):
    data = _good(tmp_path, mode).read_bytes()
    truncated = tmp_path / "truncated.nemo"
    truncated.write_bytes(data[: len(data) // 2])
    with pytest.raises(NemoArchiveError, match=r"truncated\.nemo"):
        read_nemo(truncated)
    no_weights = _nemo(tmp_path / "config-only.nemo", [("model_config.yaml", CONFIG, "file")])
    with pytest.raises(NemoArchiveError, match=r"no model_weights\.ckpt in the archive"):
        read_nemo(no_weights)
    with pytest.raises(NemoArchiveError, match=r"no such \.nemo file"):
        read_nemo(tmp_path / "absent.nemo")
