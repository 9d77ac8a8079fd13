"""JSONL manifests: round trip, atomic writes, and errors that name the file, line and key."""

import json

import pytest

from asrkit.data.manifest import ManifestError, Utterance, read_manifest, write_manifest


def test_round_trip(tmp_path):
    utts = [
        Utterance("1-2-0000", "/a/1-2-0000.flac", 1.25, "HELLO WORLD", "1"),
        Utterance("1-2-0001", "/a/1-2-0001.flac", 3.0, "ÉTÉ", "1"),
    ]
    path = tmp_path / "m.jsonl"
    assert write_manifest(path, utts) == 2
    assert read_manifest(path) == utts
    assert not list(tmp_path.glob(".*tmp"))


def test_failed_write_keeps_the_previous_manifest(tmp_path):
    path = tmp_path / "m.jsonl"
    good = [Utterance("a", "/a.flac", 1.0, "A", "s")]
    write_manifest(path, good)

    def exploding():
        yield Utterance("b", "/b.flac", 1.0, "B", "s")
        raise RuntimeError("disk full")

    with pytest.raises(RuntimeError):
        write_manifest(path, exploding())
    assert read_manifest(path) == good
    assert not list(tmp_path.glob(".*tmp"))


@pytest.mark.parametrize(
    "record,message",
    [
        ("not json", "m.jsonl:2: not valid JSON"),
        (json.dumps({"id": "x"}), "m.jsonl:2: missing key 'audio_path'"),
        (
            json.dumps(dict(id="x", audio_path="a", duration="1", text="A", speaker="s")),
            "key 'duration' has the wrong type",
        ),
        (
            json.dumps(dict(id="x", audio_path="a", duration=0, text="A", speaker="s")),
            "utterance x: duration must be > 0",
        ),
        (
            json.dumps(dict(id="x", audio_path="a", duration=1, text="A", speaker="s", z=1)),
            "unknown key",
        ),
    ],
)
def test_bad_lines_are_reported_with_file_and_line(tmp_path, record, message):
    path = tmp_path / "m.jsonl"
    ok = json.dumps(dict(id="ok", audio_path="a", duration=1.0, text="A", speaker="s"))
    path.write_text(ok + "\n" + record + "\n")
    with pytest.raises(ManifestError, match=message):
        read_manifest(path)
