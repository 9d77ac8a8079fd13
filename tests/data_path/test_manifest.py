"""JSONL manifests: round trip, atomic writes, and errors that name the file, line and key."""

import json
import re

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


def test_a_nemo_manifest_is_read_with_its_segments_and_relative_paths(tmp_path):
    """NeMo's keys: audio_filepath (relative: from the manifest's directory), duration, text,
    offset (a segment), speaker or speaker_id, lang and other keys NeMo datasets carry."""
    (tmp_path / "audio").mkdir()
    (tmp_path / "audio/long.flac").write_bytes(b"")
    lines = [
        {"audio_filepath": "audio/long.flac", "duration": 2.5, "text": "Grüß Gott!",
         "offset": 10.0, "lang": "de", "speaker_id": 7},
        {"audio_filepath": "/data/b.wav", "duration": 1.0, "text": "b", "pnc": "yes"},
        {"id": "own", "audio_path": "/a.flac", "duration": 1.0, "text": "A", "speaker": "s",
         "offset": 0.5},
    ]  # fmt: skip
    path = tmp_path / "m.json"
    path.write_text("".join(json.dumps(line, ensure_ascii=False) + "\n" for line in lines))
    segment, whole, asrkit_line = read_manifest(path)
    assert segment == Utterance("long-10.00", str(tmp_path / "audio/long.flac"), 2.5,
                                "Grüß Gott!", "7", 10.0)  # fmt: skip
    assert whole == Utterance("b", "/data/b.wav", 1.0, "b", "unknown", None)
    assert asrkit_line.offset == 0.5
    write_manifest(tmp_path / "again.jsonl", [segment, whole])
    assert read_manifest(tmp_path / "again.jsonl") == [segment, whole]
    assert "offset" not in (tmp_path / "again.jsonl").read_text().splitlines()[1]


@pytest.mark.parametrize(
    ("record", "message"),
    [({"audio_filepath": "a.wav", "text": "x"}, "missing key 'duration' (a NeMo manifest"),
     ({"audio_filepath": "a.wav", "duration": 1, "text": 3}, "key 'text' has the wrong type"),
     ({"audio_filepath": "a.wav", "duration": 1, "text": "x", "offset": -1},
      "key 'offset' must be a number of seconds >= 0")],
)  # fmt: skip
def test_bad_nemo_entries_are_named_by_line(tmp_path, record, message):
    path = tmp_path / "m.json"
    path.write_text('{"audio_filepath": "a.wav", "duration": 1, "text": "ok"}\n'
                    + json.dumps(record) + "\n")  # fmt: skip
    with pytest.raises(ManifestError, match=re.escape(f"m.json:2: {message}")):
        read_manifest(path)


def test_a_segment_is_read_from_the_long_file(tmp_path):
    import numpy as np
    import soundfile

    from asrkit.data.manifest import read_utterance

    rate = 16000
    samples = np.sin(np.arange(5 * rate) * 0.01).astype(np.float32) * 0.5
    soundfile.write(tmp_path / "long.wav", samples, rate, subtype="FLOAT")
    segment = Utterance("s", str(tmp_path / "long.wav"), 1.5, "x", "s", 2.0)
    np.testing.assert_array_equal(
        read_utterance(segment, rate), samples[2 * rate : 3 * rate + rate // 2]
    )
    whole = Utterance("w", str(tmp_path / "long.wav"), 5.0, "x", "s")
    assert len(read_utterance(whole, rate)) == len(samples)
