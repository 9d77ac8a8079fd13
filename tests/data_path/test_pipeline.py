"""Shards and the bucketed tf.data pipeline: nothing dropped or duplicated, budget respected,
padding never leaks, SpecAugment stays inside each utterance, order is a function of the seed."""

import collections
import json

import numpy as np
import pytest
import tensorflow as tf

from asrkit.audio import read_audio
from asrkit.data.librispeech import prepare_librispeech
from asrkit.data.manifest import read_manifest
from asrkit.data.pipeline import (
    PipelineConfig,
    SpecAugmentConfig,
    bucket_plan,
    for_every_worker,
    frequency_warp,
    index_shards,
    make_dataset,
    spec_augment,
)
from asrkit.data.records import parse_example, serialize_example, write_shards
from asrkit.data.synthetic import make_synthetic_corpus
from asrkit.features import log_mel
from asrkit.tokenizer import train_tokenizer
from tests.data_path.fake_shards import fake_shards


def _collect(dataset):
    return [tuple(t.numpy() for t in batch) for batch in dataset]


def test_bucketing_keeps_every_utterance_once_within_budget(tmp_path):
    files, lengths = fake_shards(tmp_path)
    config = PipelineConfig(batch_seconds=8.0, num_buckets=4, spec_augment=None)
    boundaries, sizes = bucket_plan(lengths, config)
    dataset = make_dataset(files, config, boundaries, sizes, training=False)
    seen = collections.Counter()
    shapes = set()
    for features, feature_lengths, labels, label_lengths in _collect(dataset):
        batch, padded = features.shape[:2]
        shapes.add(padded)
        assert batch * padded <= 800 or batch == 1  # 8 s budget = 800 frames
        assert padded in [b - 1 for b in boundaries] or padded == max(feature_lengths)
        for row in range(batch):
            n = feature_lengths[row]
            assert np.all(features[row, :n] != 0) and np.all(features[row, n:] == 0)
            assert np.all(labels[row, label_lengths[row] :] == 0)
            seen[(int(n), int(labels[row, 0]))] += 1
        assert labels.shape[1] % 8 == 0 and labels.shape[1] - max(label_lengths) < 8
    assert sum(seen.values()) == len(lengths)
    want = collections.Counter((int(n), 1 + i % 7) for i, n in enumerate(lengths))
    assert seen == want
    assert len(shapes) <= len(boundaries)


def test_padding_efficiency_beats_padding_to_the_global_max(tmp_path):
    files, lengths = fake_shards(tmp_path, n=120)
    config = PipelineConfig(batch_seconds=8.0, num_buckets=6, spec_augment=None)
    boundaries, sizes = bucket_plan(lengths, config)
    real = padded = 0
    for features, feature_lengths, *_ in _collect(
        make_dataset(files, config, boundaries, sizes, training=False)
    ):
        real += feature_lengths.sum()
        padded += features.shape[0] * features.shape[1]
    assert real / padded > 0.8
    assert real / padded > lengths.sum() / (len(lengths) * lengths.max()) + 0.2


def test_training_order_is_a_function_of_seed_and_epoch(tmp_path):
    files, lengths = fake_shards(tmp_path)
    config = PipelineConfig(batch_seconds=8.0, num_buckets=4)
    plan = bucket_plan(lengths, config)

    def run(**kw):
        return _collect(make_dataset(files, config, *plan, training=True, seed=1, **kw))

    first, again, other = run(epoch=0), run(epoch=0), run(epoch=1)
    assert all(np.array_equal(a[0], b[0]) for a, b in zip(first, again, strict=True))
    assert not all(
        a[0].shape == b[0].shape and np.array_equal(a[0], b[0])
        for a, b in zip(first, other, strict=False)
    )
    resumed = run(epoch=0, skip_batches=3)
    assert all(np.array_equal(a[0], b[0]) for a, b in zip(first[3:], resumed, strict=True))


def test_spec_augment_masks_only_inside_the_utterance():
    config = SpecAugmentConfig(freq_masks=2, freq_width=10, time_masks=2, time_width_ratio=0.1)
    features = tf.ones([120, 80])
    masked_any = False
    for s in range(20):
        out = spec_augment(features, tf.constant(100), config, tf.constant([s, 0], tf.int64))
        out = out.numpy()
        zero_frames = np.flatnonzero((out == 0).all(axis=1))
        assert np.all(zero_frames < 100)
        assert len(zero_frames) <= 2 * 10  # two masks of at most 10 % of 100 frames
        zero_bins = np.flatnonzero((out == 0).all(axis=0))
        assert len(zero_bins) <= 2 * 10
        masked_any |= (out == 0).any()
    assert masked_any


def test_augmented_batches_keep_lengths_and_zero_padding(tmp_path):
    files, lengths = fake_shards(tmp_path)
    plain = PipelineConfig(batch_seconds=8.0, num_buckets=4, spec_augment=None)
    augmented = PipelineConfig(batch_seconds=8.0, num_buckets=4)
    plan = bucket_plan(lengths, plain)
    a = _collect(make_dataset(files, plain, *plan, training=True, seed=2))
    b = _collect(make_dataset(files, augmented, *plan, training=True, seed=2))
    changed = 0
    for (fa, la, ya, ua), (fb, lb, yb, ub) in zip(a, b, strict=True):
        np.testing.assert_array_equal(la, lb)
        np.testing.assert_array_equal(ya, yb)
        np.testing.assert_array_equal(ua, ub)
        for row in range(len(la)):
            assert np.all(fb[row, la[row] :] == 0)
            diff = fa[row] != fb[row]
            assert np.all(fb[row][diff] == 0)  # augmentation only zeroes, never moves
            changed += diff.any()
    assert changed > 0


@pytest.mark.parametrize("factor", [0.9, 1.0, 1.13])
def test_frequency_warp_is_linear_interpolation_of_the_mel_axis(factor):
    rng = np.random.default_rng(3)
    features = rng.standard_normal((7, 80)).astype(np.float32)
    out = frequency_warp(tf.constant(features), tf.constant(factor)).numpy()
    source = np.clip(np.arange(80) / factor, 0, 79)
    expected = np.stack([np.interp(source, np.arange(80), row) for row in features])
    np.testing.assert_allclose(out, expected, atol=1e-4)
    # A formant at bin 30 moves to bin 30 x factor.
    peak = np.zeros((1, 80), np.float32)
    peak[0, 30] = 1.0
    moved = frequency_warp(tf.constant(peak), tf.constant(factor)).numpy()[0]
    assert abs(np.argmax(moved) - 30 * factor) <= 1.0


@pytest.mark.slow
def test_frequency_warp_applies_before_normalising_in_training_only(tmp_path):
    files, lengths = fake_shards(tmp_path)
    base = PipelineConfig(batch_seconds=8.0, num_buckets=4, spec_augment=None)
    warped = PipelineConfig(batch_seconds=8.0, num_buckets=4, spec_augment=None,
                            freq_warp=0.2)  # fmt: skip
    plan = bucket_plan(lengths, base)
    normalize = lambda x: (x - 5.0) * 2.0  # noqa: E731
    a = _collect(make_dataset(files, base, *plan, training=True, seed=2, normalize=normalize))
    b = _collect(make_dataset(files, warped, *plan, training=True, seed=2, normalize=normalize))
    again = make_dataset(files, warped, *plan, training=True, seed=2, normalize=normalize)
    for (fa, la, *_), (fb, lb, *_), (fc, *_) in zip(a, b, _collect(again), strict=True):
        np.testing.assert_array_equal(la, lb)
        np.testing.assert_array_equal(fb, fc)  # a function of (seed, epoch)
        for row in range(len(la)):
            n = la[row]
            assert np.all(fb[row, n:] == 0)
            assert not np.allclose(fa[row, :n], fb[row, :n])
            # Each frame of b is a warp of the raw frame: un-normalise, then check against
            # interpolation of the raw features at some factor in [0.8, 1.2].
            raw_b, raw_a = fb[row, :n] / 2.0 + 5.0, fa[row, :n] / 2.0 + 5.0

            def error(factor, raw_a=raw_a, raw_b=raw_b):
                warp = frequency_warp(tf.constant(raw_a), tf.constant(factor)).numpy()
                return np.abs(warp - raw_b).max()

            coarse = min(np.linspace(0.8, 1.2, 201), key=error)
            fine = min(np.linspace(coarse - 0.002, coarse + 0.002, 201), key=error)
            assert error(fine) < 0.01 < error(1.0)
    evaluation = _collect(make_dataset(files, warped, *plan, training=False, normalize=normalize))
    plain = _collect(make_dataset(files, base, *plan, training=False, normalize=normalize))
    for (fa, *_), (fb, *_) in zip(evaluation, plain, strict=True):
        np.testing.assert_array_equal(fa, fb)


def test_too_few_frames_for_the_tokens_are_filtered_and_counted(tmp_path):
    path = tmp_path / "f.tfrecord"
    with tf.io.TFRecordWriter(str(path)) as w:
        w.write(serialize_example("ok", np.ones((43, 80), np.float32), [1] * 10, 0.4))
        w.write(serialize_example("short", np.ones((43, 80), np.float32), [1] * 11, 0.4))
    path.with_suffix(".lengths.json").write_text(json.dumps({"frames": [43, 43],
                                                             "tokens": [10, 11]}))  # fmt: skip
    config = PipelineConfig(spec_augment=None)
    index = index_shards([str(path)])
    assert len(index.frames) == 1 and index.unusable == 1
    batches = _collect(make_dataset([str(path)], config, [100], [10], training=False))
    assert sum(len(b[1]) for b in batches) == 1
    # A FastConformer's x8 subsampling leaves 5 encoder frames: nothing to train on, named.
    from asrkit.errors import InputError
    from tests.tiny import tiny_encoder

    fast = tiny_encoder("nemo_conformer")
    with pytest.raises(InputError, match=r"shards/x: none of its 2 utterance\(s\).*80 ms"):
        index_shards([str(path)], fast, "shards/x")


@pytest.mark.parametrize("speeds", [(1.0,), (0.9, 1.0, 1.1)])
def test_shards_hold_the_features_and_tokens_and_resume(tmp_path, speeds):
    corpus = tmp_path / "corpus"
    make_synthetic_corpus(corpus, "tiny", seed=5, show_progress=False)
    prepare_librispeech(corpus, ["train-clean-100"], tmp_path, show_progress=False)
    manifest = tmp_path / "train-clean-100.jsonl"
    utts = read_manifest(manifest)
    tok = train_tokenizer([u.text for u in utts] * 3, tmp_path / "tok", 30, "char")
    out = tmp_path / "shards"
    summary = write_shards(manifest, tok, out, num_shards=3, speeds=speeds, show_progress=False)
    assert summary.utterances == len(utts) * len(speeds)
    records = {}
    for shard in summary.shards:
        for raw in tf.data.TFRecordDataset(str(shard)):
            e = parse_example(raw, 80)
            records[e["id"].numpy().decode()] = e
    assert len(records) == len(utts) * len(speeds)
    for u in utts:
        e = records[u.id]
        want = log_mel(read_audio(u.audio_path)).numpy()
        np.testing.assert_allclose(e["features"].numpy(), want, atol=1e-5)
        assert e["labels"].numpy().tolist() == tok.encode(u.text)
        if 0.9 in speeds:
            slow, fast = records[f"sp0.9-{u.id}"], records[f"sp1.1-{u.id}"]
            assert slow["feature_lengths"] > e["feature_lengths"] > fast["feature_lengths"]
    summary.shards[1].unlink()
    again = write_shards(manifest, tok, out, num_shards=3, speeds=speeds, show_progress=False)
    assert again.skipped_existing == 2 and summary.shards[1].exists()


def test_shard_lengths_match_the_records(tmp_path):
    from asrkit.data.records import shard_counts, shard_lengths

    corpus = tmp_path / "corpus"
    make_synthetic_corpus(corpus, "tiny", seed=6, show_progress=False)
    prepare_librispeech(corpus, ["train-clean-100"], tmp_path, show_progress=False)
    manifest = tmp_path / "train-clean-100.jsonl"
    tok = train_tokenizer([u.text for u in read_manifest(manifest)] * 3, tmp_path / "t", 30, "char")
    write_shards(manifest, tok, tmp_path / "s", num_shards=2, show_progress=False)
    files, lengths = shard_lengths(tmp_path / "s")
    parsed = [parse_example(r, 80) for r in tf.data.TFRecordDataset(files)]
    assert sorted(int(e["feature_lengths"]) for e in parsed) == sorted(lengths.tolist())
    _, frames, tokens = shard_counts(tmp_path / "s")
    assert sorted(zip(frames.tolist(), tokens.tolist(), strict=True)) == sorted(
        (int(e["feature_lengths"]), int(e["label_lengths"])) for e in parsed
    )
    with pytest.raises(FileNotFoundError, match="asrkit features extract"):
        shard_lengths(tmp_path)


def test_no_autotuning_in_any_pipeline_also_as_the_trainer_distributes_it(tmp_path):
    """tf.data's autotuning is off in every pipeline, also after the trainer adds its own
    options (`for_every_worker`, the trainer's own code): with it on (TF 2.21) freeing a
    spent training iterator blocked for up to a minute, stalling whatever ran when the
    garbage collector freed it."""
    files, lengths = fake_shards(tmp_path)
    config = PipelineConfig(batch_seconds=8.0, num_buckets=4)
    plan = bucket_plan(lengths, config)
    for training in (True, False):
        plain = make_dataset(files, config, *plan, training=training, seed=1)
        distributed = for_every_worker(plain)
        for dataset in (plain, distributed):
            assert dataset.options().autotune.enabled is False
        policy = distributed.options().experimental_distribute.auto_shard_policy
        assert policy == tf.data.experimental.AutoShardPolicy.DATA
        assert sum(1 for _ in distributed) == sum(1 for _ in plain) > 0


def test_the_configs_spec_augment_settings_reach_the_pipeline():
    """data.spec_* (what `asrkit import nemo` maps NeMo's spec_augment onto) set the masks:
    NeMo's template (2 bands of 27 bins, 10 spans of 5 %) and a frame-count width."""
    from asrkit.config import DataConfig, ExperimentConfig
    from asrkit.data.pipeline import pipeline_config

    data = DataConfig(spec_freq_masks=2, spec_freq_width=27, spec_time_masks=10,
                      spec_time_width=0.05)  # fmt: skip
    augment = pipeline_config(ExperimentConfig(data=data)).spec_augment
    assert augment == SpecAugmentConfig(2, 27, 10, 0.05, 0)
    frames = SpecAugmentConfig(freq_masks=0, freq_width=0, time_masks=3, time_width_frames=4)
    features = tf.ones([300, 8])
    widest = 0
    for s in range(30):
        out = spec_augment(features, tf.constant(300), frames, tf.constant([s, 1], tf.int64))
        zero_frames = np.flatnonzero((out.numpy() == 0).all(axis=1))
        assert len(zero_frames) <= 3 * 4
        widest = max(widest, len(zero_frames))
    assert widest > 4  # more than one span: the count is per mask, not in total
    off = DataConfig(spec_augment=False)
    assert pipeline_config(ExperimentConfig(data=off)).spec_augment is None
