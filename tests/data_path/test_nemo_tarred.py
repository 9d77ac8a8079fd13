"""NeMo's tarred datasets read as they are: the fixture NeMo's own converter wrote
(`tools/make_nemo_fixtures.py --parts tarred`) gives each entry the audio of its source
clip (a segment where the entry has an offset), by sharded manifests or by shard_id; a
missing or extra member is named; corrupt audio is skipped and listed, or refused."""

import io
import json
import shutil
import tarfile
from pathlib import Path

import numpy as np
import pytest
import soundfile

from asrkit.cli.main import main
from asrkit.data.manifest import ManifestError, Utterance, read_utterance
from asrkit.data.nemo_tarred import expand_braces, read_tarred
from asrkit.data.records import write_shards
from asrkit.tokenizer import train_tokenizer

ROOT = Path(__file__).resolve().parents[2]
FIXTURE = ROOT / "tests/data/nemo/tarred"
CLIPS = ROOT / "tests/data/realspeech/test-real/9002/90021"
SHARDED = str(FIXTURE / "sharded_manifests/manifest_{0..1}.json")
TARS = str(FIXTURE / "audio_{0..1}.tar")


def test_brace_patterns_expand_as_nemo_writes_them():
    assert expand_braces("a_{0..2}.tar") == ["a_0.tar", "a_1.tar", "a_2.tar"]
    assert expand_braces("a__OP_0..1_CL_.tar") == ["a_0.tar", "a_1.tar"]
    assert expand_braces("m{08..10}") == ["m08", "m09", "m10"]
    assert expand_braces("{x,y}/{0..1}") == ["x/0", "x/1", "y/0", "y/1"]
    assert expand_braces("plain.tar") == ["plain.tar"]
    with pytest.raises(ManifestError, match="a range needs numbers"):
        expand_braces("a_{x..y}.tar")


def _source(utterance: Utterance) -> np.ndarray:
    """The entry's audio from the clip it was tarred from."""
    name = utterance.member.removeprefix("audio_")
    samples, _ = soundfile.read(CLIPS / name, dtype="float32")
    if utterance.offset is None:
        return samples
    start = round(utterance.offset * 16000)
    return samples[start : start + round(utterance.duration * 16000)]


@pytest.mark.parametrize("manifests", [SHARDED, str(FIXTURE / "tarred_audio_manifest.json")])
def test_every_entry_reads_its_clips_audio(manifests):
    found = read_tarred(manifests, TARS)
    assert found.missing == [] and found.extra == []
    assert len(found.utterances) == 4
    texts = {line.split(" ", 1)[0]: line.split(" ", 1)[1].lower()
             for line in (CLIPS / "9002-90021.trans.txt").read_text().splitlines()}  # fmt: skip
    for utterance in found.utterances:
        samples = read_utterance(utterance, 16000)
        np.testing.assert_array_equal(samples, _source(utterance), err_msg=utterance.id)
        assert abs(len(samples) / 16000 - utterance.duration) < 0.01
        if utterance.offset is None:
            assert utterance.text == texts[Path(utterance.member).stem.removeprefix("audio_")]
    segment = [u for u in found.utterances if u.offset is not None]
    assert [(u.offset, u.duration) for u in segment] == [(0.5, 0.8)]
    assert segment[0].audio_path.endswith("audio_1.tar")


def _tamper(tmp_path, drop=None, add=None, truncate=None) -> str:
    """A copy of the fixture whose audio_0.tar lacks `drop`, holds `add` too, or holds
    `truncate` cut in half."""
    copy = tmp_path / "tarred"
    shutil.copytree(FIXTURE, copy)
    with tarfile.open(FIXTURE / "audio_0.tar") as tar:
        members = [(m, tar.extractfile(m).read()) for m in tar.getmembers()]
    with tarfile.open(copy / "audio_0.tar", "w") as tar:
        for member, data in members:
            if member.name == drop:
                continue
            if member.name == truncate:
                data = data[: len(data) // 2]
                member.size = len(data)
            tar.addfile(member, io.BytesIO(data))
        if add:
            info = tarfile.TarInfo(add)
            info.size = 4
            tar.addfile(info, io.BytesIO(b"RIFF"))
    return str(copy / "audio_{0..1}.tar")


def test_missing_and_extra_members_are_named(tmp_path):
    gone = "audio_9002-90021-0001.flac"
    tars = _tamper(tmp_path, drop=gone, add="stray.wav")
    found = read_tarred(SHARDED, tars)
    assert len(found.utterances) == 3
    assert len(found.missing) == 1 and "manifest_0.json:1" in found.missing[0]
    assert gone in found.missing[0] and "audio_0.tar" in found.missing[0]
    assert len(found.extra) == 1 and "stray.wav" in found.extra[0]


def test_an_entry_written_twice_names_its_member_with_sub(tmp_path):
    """NeMo's converter names a second entry of a file already in the tar `name-subN.ext`."""
    manifest = tmp_path / "manifest.json"
    entries = [json.loads(line) for line in (FIXTURE / "sharded_manifests/manifest_0.json")
               .read_text().splitlines()]  # fmt: skip
    second = entries[0]["audio_filepath"].replace(".flac", "-sub1.flac")
    twice = {**entries[0], "audio_filepath": second}
    manifest.write_text("".join(json.dumps(e) + "\n" for e in [*entries, twice]))
    found = read_tarred(str(manifest), str(FIXTURE / "audio_0.tar"))
    assert found.missing == [] and len(found.utterances) == 3
    assert found.utterances[-1].member == entries[0]["audio_filepath"]
    assert found.utterances[-1].id != found.utterances[0].id


def test_mismatched_patterns_are_refused_naming_them(tmp_path):
    with pytest.raises(ManifestError, match=r"audio_2\.tar: no such file"):
        read_tarred(SHARDED, str(FIXTURE / "audio_{0..2}.tar"))
    with pytest.raises(ManifestError, match="2 manifests for 1 tar files"):
        read_tarred(SHARDED, str(FIXTURE / "audio_0.tar"))
    with pytest.raises(ManifestError, match=r"tarred_audio_manifest\.json:3: shard_id 1"):
        read_tarred(str(FIXTURE / "tarred_audio_manifest.json"), str(FIXTURE / "audio_0.tar"))
    broken = tmp_path / "broken.json"
    broken.write_text((FIXTURE / "sharded_manifests/manifest_0.json").read_text() + "{oops\n")
    with pytest.raises(ManifestError, match=r"broken\.json:3: not valid JSON"):
        read_tarred(str(broken), str(FIXTURE / "audio_0.tar"))


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    texts = [u.text for u in read_tarred(SHARDED, TARS).utterances]
    directory = tmp_path_factory.mktemp("tok")
    return train_tokenizer(texts * 3, directory, 30, "char"), directory


def _run(argv) -> int:
    try:
        return main(argv)
    except SystemExit as exit_:
        return exit_.code


def test_shards_from_a_tarred_set_hold_what_the_clips_give(tmp_path, tokenizer):
    """The features of a tarred set's shards equal those of a manifest of the clips."""
    tokenizer, _ = tokenizer
    found = read_tarred(SHARDED, TARS)
    plain = tmp_path / "plain.jsonl"
    plain.write_text("".join(json.dumps({
        "id": u.id, "audio_path": str(CLIPS / u.member.removeprefix("audio_")),
        "duration": u.duration, "text": u.text, "speaker": "s",
        **({"offset": u.offset} if u.offset is not None else {})}) + "\n"
        for u in found.utterances))  # fmt: skip
    write_shards(SHARDED, tokenizer, tmp_path / "t", num_shards=2, utterances=found.utterances,
                 show_progress=False)  # fmt: skip
    write_shards(plain, tokenizer, tmp_path / "p", num_shards=2, show_progress=False)
    for name in ("shard-00000-of-00002.tfrecord", "shard-00001-of-00002.tfrecord"):
        assert (tmp_path / "t" / name).read_bytes() == (tmp_path / "p" / name).read_bytes()


def test_corrupt_audio_is_skipped_and_listed_or_refused(tmp_path, tokenizer, capsys):
    bad = "audio_9002-90021-0000.flac"
    tars = _tamper(tmp_path, truncate=bad)
    argv = ["features", "extract", "--manifest", SHARDED, "--tarred-audio", tars,
            "--tokenizer", str(tokenizer[1]), "--shards", "2"]  # fmt: skip
    assert _run([*argv, "--out", str(tmp_path / "s")]) == 0
    out = capsys.readouterr().out
    assert "3 utterances" in out and "skipped 1 utterance(s)" in out and bad in out
    listed = json.loads((tmp_path / "s" / "shards.json").read_text())["unreadable"]
    assert list(listed) == ["audio_9002-90021-0000"] and "audio_0.tar" in str(listed)
    assert _run([*argv, "--out", str(tmp_path / "strict"), "--strict"]) == 2
    err = capsys.readouterr().err
    assert "audio_9002-90021-0000" in err and "Traceback" not in err
    assert not list((tmp_path / "strict").glob("*.tmp"))


def test_an_entry_without_its_member_is_skipped_or_refused(tmp_path, tokenizer, capsys):
    tars = _tamper(tmp_path, drop="audio_9002-90021-0001.flac")
    argv = ["features", "extract", "--manifest", SHARDED, "--tarred-audio", tars,
            "--tokenizer", str(tokenizer[1]), "--shards", "1"]  # fmt: skip
    assert _run([*argv, "--out", str(tmp_path / "s")]) == 0
    out = capsys.readouterr().out
    assert "1 entries skipped: no member" in out and "3 utterances" in out
    assert _run([*argv, "--out", str(tmp_path / "strict"), "--strict"]) == 2
    assert "name no member of their tar" in capsys.readouterr().err
