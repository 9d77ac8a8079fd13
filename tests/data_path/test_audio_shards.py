"""Audio in the shards: a record's features at speed s are exactly the feature shards'
record of that utterance at speed s; the shards are about the size of the FLAC they came
from; each training epoch draws its speeds, its lengths are known before reading, and a
resumed epoch reads the same micro-batches."""

import os

import numpy as np
import pytest
import tensorflow as tf

from asrkit.config import FeatureConfig
from asrkit.data.audio_shards import OnTheFly, epoch_frames, speed_samples
from asrkit.data.manifest import read_manifest
from asrkit.data.pipeline import (
    PipelineConfig,
    bucket_plan,
    epoch_lengths,
    index_shards,
    make_dataset,
)
from asrkit.data.records import (
    ShardMismatch,
    on_the_fly,
    parse_example,
    shard_features,
    shard_files,
    shard_store,
    write_shards,
)
from asrkit.features import perturb_speed
from asrkit.tokenizer import Tokenizer
from tests.data_path.conftest import tiny_corpus

SPEEDS = (0.9, 1.0, 1.1)


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    work = tmp_path_factory.mktemp("audio_shards")
    manifest, tok = tiny_corpus(work, seed=3, vocab=28)
    for store in ("features", "audio"):
        write_shards(manifest, tok, work / store, num_shards=2, speeds=SPEEDS, store=store,
                     show_progress=False)  # fmt: skip
    return work, manifest


def _records(directory, audio=None, speed=1.0):
    files = shard_files(directory)
    return [parse_example(r, 80, audio, speed) for r in tf.data.TFRecordDataset(files)]


def test_an_audio_record_at_each_speed_is_the_feature_record_at_that_speed(shards):
    """Bit for bit when computed eagerly, as the feature shards are written."""
    work, _ = shards
    assert shard_store(work / "audio") == "audio" and shard_store(work / "features") == "features"
    audio = on_the_fly(work / "audio", FeatureConfig())
    assert audio == OnTheFly(FeatureConfig(), SPEEDS)
    stored = {e["id"].numpy().decode(): e["features"].numpy() for e in _records(work / "features")}
    assert len(stored) == 3 * len(_records(work / "audio", audio))
    for speed in SPEEDS:
        for e in _records(work / "audio", audio, speed):
            utt = e["id"].numpy().decode()
            want = stored[utt if speed == 1.0 else f"sp{speed}-{utt}"]
            np.testing.assert_array_equal(e["features"].numpy(), want, err_msg=f"{utt} x{speed}")


def test_a_rerun_with_the_other_store_is_refused(shards, tmp_path):
    work, manifest = shards
    tok = Tokenizer.load(work / "tok")
    for store, other in (("audio", "features"), ("features", "audio")):
        with pytest.raises(ShardMismatch, match=f"they hold {store}, not {other}"):
            write_shards(manifest, tok, work / store, num_shards=2, speeds=SPEEDS, store=other,
                         show_progress=False)  # fmt: skip
    with pytest.raises(ValueError, match="store must be one of"):
        write_shards(manifest, tok, tmp_path / "x", store="wav", show_progress=False)
    assert not (tmp_path / "x").exists()


def test_the_planned_lengths_are_the_features_lengths_at_any_speed(shards):
    """`speed_samples` predicts the resampler's output length, so an epoch's lengths (and
    its buckets and micro-batches) are known before any record is read."""
    rng = np.random.default_rng(0)
    lengths = [1, 2, 399, 400, 401, *rng.integers(1_000, 300_000, 40).tolist()]
    for speed in (0.9, 0.95, 1.0, 1.05, 1.1, 1.2):
        got = [len(perturb_speed(np.zeros(n, np.float32), speed)) for n in lengths]
        np.testing.assert_array_equal(speed_samples(lengths, speed), got, err_msg=str(speed))
    work, _ = shards
    index = index_shards(shard_files(work / "audio"))
    config = FeatureConfig()
    for speed in SPEEDS:
        frames = epoch_frames(index.samples, np.full(len(index.samples), speed), config)
        real = [len(e["features"]) for e in _records(work / "audio", OnTheFly(config), speed)]
        np.testing.assert_array_equal(frames, real)


def test_audio_shards_are_about_the_size_of_their_flac(shards):
    """Three speeds in features: about 3 x 120 MB per hour; in audio: the FLAC once."""
    work, manifest = shards
    flac = sum(os.path.getsize(u.audio_path) for u in read_manifest(manifest))
    audio = sum(p.stat().st_size for p in (work / "audio").glob("*.tfrecord"))
    features = sum(p.stat().st_size for p in (work / "features").glob("*.tfrecord"))
    assert audio <= 1.2 * flac, (audio, flac)
    assert features > 3 * audio, (features, audio)


def test_each_epoch_draws_its_speeds_and_a_resumed_epoch_reads_the_same(shards):
    work, _ = shards
    audio = on_the_fly(work / "audio", FeatureConfig())
    files = shard_files(work / "audio")
    index = index_shards(files, audio=audio)
    # planned at the slowest speed: every epoch's lengths fit under it
    slow = epoch_frames(index.samples, np.full(len(index.samples), 0.9), audio.features)
    np.testing.assert_array_equal(index.frames, slow)
    config = PipelineConfig(batch_seconds=8.0, num_buckets=2, spec_augment=None)
    plan = bucket_plan(index.frames, config)

    def epoch(number, skip=0):
        dataset = make_dataset(files, config, *plan, training=True, seed=5, epoch=number,
                               skip_batches=skip, index=index, audio=audio)  # fmt: skip
        return [(b.features.numpy(), b.feature_lengths.numpy()) for b in dataset]

    first, second = epoch(0), epoch(1)
    lengths = [epoch_lengths(index, audio, training=True, seed=5, epoch=e) for e in (0, 1)]
    assert not np.array_equal(lengths[0], lengths[1])  # other speeds drawn
    assert set(np.round(index.samples / speed_samples(index.samples, 1.1), 1)) <= set(SPEEDS)
    for got, want in ((first, lengths[0]), (second, lengths[1])):
        assert sorted(int(n) for _, fl in got for n in fl) == sorted(want.tolist())
    again = epoch(0)
    for (a, la), (b, lb) in zip(first, again, strict=True):
        np.testing.assert_array_equal(a, b)
        np.testing.assert_array_equal(la, lb)
    tail = epoch(0, skip=2)
    assert len(tail) == len(first) - 2
    for (a, _), (b, _) in zip(first[2:], tail, strict=True):
        np.testing.assert_array_equal(a, b)
    # decoding reads them at speed 1
    assert sorted(epoch_lengths(index, audio, training=False, seed=5, epoch=0).tolist()) == \
        sorted(len(e["features"]) for e in _records(work / "audio", audio))  # fmt: skip


def test_statistics_of_audio_shards_are_those_of_their_speed_one_features(shards):
    work, _ = shards
    _, from_audio = shard_features(work / "audio", FeatureConfig())
    _, from_features = shard_features(work / "features", FeatureConfig())
    audio = on_the_fly(work / "audio", FeatureConfig())
    ones = {e["id"].numpy().decode() for e in _records(work / "audio", audio)}
    want = [f.numpy() for f, e in zip(from_features, _records(work / "features"), strict=True)
            if e["id"].numpy().decode() in ones]  # fmt: skip
    got = [f.numpy() for f in from_audio]
    assert sorted(map(len, got)) == sorted(map(len, want))
    # computed in a tf.data graph, whose STFT rounds unlike the eager one the feature shards
    # are written with: within 2e-4 of each log-mel value (up to 14 here)
    total = [np.concatenate(x).astype(np.float64).sum(0) for x in (got, want)]
    np.testing.assert_allclose(*total, rtol=2e-5)
    assert max(np.abs(a).max() for a in got) > 5
