"""Joined training utterances: every utterance exactly once, joined only with the same
speaker's next ones and within the length, the share drawn per utterance; in shards the
joined example is the log-mel of the audio back to back with the transcripts joined."""

import json

import numpy as np
import pytest
import tensorflow as tf

from asrkit.audio import read_audio
from asrkit.data.joining import JoinedUtterance, JoinSettings, join_consecutive
from asrkit.data.manifest import Utterance, read_manifest
from asrkit.data.records import ShardMismatch, parse_example, write_shards
from asrkit.features import log_mel


def _utterances(durations_and_speakers):
    return [Utterance(f"u{i}", f"/a/{i}.flac", d, f"W{i}", s)
            for i, (d, s) in enumerate(durations_and_speakers)]  # fmt: skip


@pytest.mark.parametrize("share", [0.0, 0.3, 0.7, 1.0])
@pytest.mark.parametrize("seed", [0, 1])
def test_every_utterance_lands_once_within_the_rules(share, seed):
    rng = np.random.default_rng(seed + 10)
    utts = _utterances(
        (float(rng.uniform(0.5, 4.0)), f"s{int(rng.integers(0, 3))}") for _ in range(60)
    )
    items = join_consecutive(utts, JoinSettings(6.0, share, seed))
    flat = [p for item in items for p in getattr(item, "parts", (item,))]
    assert flat == utts  # each once, the order kept
    draws = np.random.default_rng(seed).random(len(utts))
    at = 0
    for item in items:
        parts = getattr(item, "parts", (item,))
        if isinstance(item, JoinedUtterance):
            assert len(parts) >= 2 and item.duration <= 6.0
            assert {p.speaker for p in parts} == {item.speaker}
            assert draws[at] < share  # a group starts only where the draw says
            assert item.text == " ".join(p.text for p in parts)
        else:
            nxt = utts[at + 1] if at + 1 < len(utts) else None
            could_join = (nxt is not None and nxt.speaker == item.speaker
                          and item.duration + nxt.duration <= 6.0)  # fmt: skip
            assert not (draws[at] < share and could_join)  # never left alone wrongly
        at += len(parts)
    if share == 0.0:
        assert items == utts


def test_joined_examples_are_the_audio_back_to_back(corpus, tmp_path):
    _, manifest, tok = corpus
    join = JoinSettings(max_seconds=60.0, share=1.0, seed=0)
    write_shards(manifest, tok, tmp_path / "j", num_shards=1, show_progress=False, join=join)
    utts = {u.id: u for u in read_manifest(manifest)}
    path = str(next((tmp_path / "j").glob("*.tfrecord")))
    examples = [parse_example(r, 80) for r in tf.data.TFRecordDataset(path)]
    joined = [e for e in examples if "+" in e["id"].numpy().decode()]
    assert joined
    for e in joined[:2]:
        first, extra = e["id"].numpy().decode().split("+")
        ids = list(utts)
        parts = [utts[i] for i in ids[ids.index(first) : ids.index(first) + int(extra) + 1]]
        audio = np.concatenate([read_audio(u.audio_path) for u in parts])
        np.testing.assert_allclose(e["features"].numpy(), log_mel(audio).numpy(), atol=1e-5)
        assert e["text"].numpy().decode() == " ".join(u.text for u in parts)
    fingerprint = json.loads((tmp_path / "j" / "shards.json").read_text())["fingerprint"]
    assert fingerprint["join"] == {"max_seconds": 60.0, "share": 1.0, "seed": 0}  # no pause key
    with pytest.raises(ShardMismatch, match="join"):
        write_shards(manifest, tok, tmp_path / "j", num_shards=1, show_progress=False)


def test_joined_examples_with_pauses_hold_the_pauses(corpus, tmp_path):
    _, manifest, tok = corpus
    join = JoinSettings(max_seconds=60.0, share=1.0, seed=0, pause_seconds=0.8)
    write_shards(manifest, tok, tmp_path / "j", num_shards=1, show_progress=False, join=join)
    planned = {item.id: item for item in join_consecutive(read_manifest(manifest), join)}
    path = str(next((tmp_path / "j").glob("*.tfrecord")))
    examples = [parse_example(r, 80) for r in tf.data.TFRecordDataset(path)]
    joined = [e for e in examples if "+" in e["id"].numpy().decode()]
    assert joined
    for e in joined[:2]:
        item = planned[e["id"].numpy().decode()]
        assert item.pauses and all(0 <= g <= 0.8 for g in item.pauses)
        pieces = [read_audio(u.audio_path) for u in item.parts]
        samples = sum(len(a) for a in pieces) + sum(round(g * 16000) for g in item.pauses)
        audio = item.audio(pieces, 16000)
        assert len(audio) == samples
        np.testing.assert_allclose(e["features"].numpy(), log_mel(audio).numpy(), atol=1e-5)
    fingerprint = json.loads((tmp_path / "j" / "shards.json").read_text())["fingerprint"]
    assert fingerprint["join"]["pause_seconds"] == 0.8


@pytest.mark.parametrize("seed", [0, 3])
def test_pauses_count_in_the_length_and_sit_between_the_parts(seed):
    rng = np.random.default_rng(seed + 20)
    utts = _utterances((float(rng.uniform(0.5, 3.0)), "s0") for _ in range(40))
    plain = join_consecutive(utts, JoinSettings(8.0, 1.0, seed))
    paused = join_consecutive(utts, JoinSettings(8.0, 1.0, seed, pause_seconds=1.5))
    assert [p for item in paused for p in getattr(item, "parts", (item,))] == utts
    joined = [item for item in paused if isinstance(item, JoinedUtterance)]
    assert joined and len(paused) >= len(plain)  # pauses take room: never fewer items
    gaps = [g for item in joined for g in item.pauses]
    assert all(0 <= g <= 1.5 for g in gaps) and np.std(gaps) > 0.2  # drawn, not fixed
    for item in joined:
        assert len(item.pauses) == len(item.parts) - 1
        spoken = sum(p.duration for p in item.parts)
        assert item.duration == pytest.approx(spoken + sum(item.pauses)) and item.duration <= 8.0
        rate = 100
        pieces = [np.full(round(p.duration * rate), 1.0, np.float32) for p in item.parts]
        audio = item.audio(pieces, rate)
        assert audio.dtype == np.float32
        at = 0
        for k, piece in enumerate(pieces):  # each part where the pauses before it put it
            np.testing.assert_array_equal(audio[at : at + len(piece)], piece)
            at += len(piece)
            if k < len(item.pauses):
                pause = audio[at : at + round(item.pauses[k] * rate)]
                assert np.sqrt(np.mean(pause**2)) < 1e-3 if len(pause) else True
                at += len(pause)
        assert at == len(audio)
        np.testing.assert_array_equal(audio, item.audio(pieces, rate))  # read twice: the same


def test_bad_join_settings_are_refused():
    with pytest.raises(ValueError, match="--join-share in"):
        JoinSettings(10.0, 1.5)
    with pytest.raises(ValueError, match="--join-seconds and --join-pause must be >= 0"):
        JoinSettings(-1.0)
    with pytest.raises(ValueError, match="--join-pause must be >= 0"):
        JoinSettings(5.0, pause_seconds=-0.5)
