"""The epoch plan: records found by byte offset, every usable utterance once per epoch,
bucket sizes as a stream would make them, an order that is a function of (seed, epoch), a
resume that reads nothing before it, and a pipeline that holds a few micro-batches."""

import json
import time
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf

from asrkit.data import pipeline
from asrkit.data.order import (
    DataPlanKey,
    changed_keys,
    epoch_order,
    order_seed,
    record_offsets,
)
from asrkit.data.pipeline import PipelineConfig, bucket_plan, index_shards, make_dataset
from tests.data_path.fake_shards import fake_shards


def test_record_offsets_find_what_tfrecorddataset_reads(tmp_path):
    files, _ = fake_shards(tmp_path, n=12)
    for path in files:
        offsets, sizes = record_offsets(path)
        data = Path(path).read_bytes()
        expected = [r.numpy() for r in tf.data.TFRecordDataset(path)]
        assert [data[o : o + s] for o, s in zip(offsets, sizes, strict=True)] == expected


def _stream_bucketing(frames, order, boundaries, sizes):
    """What tf.data's bucket_by_sequence_length makes of a stream, written out plainly."""
    batches, pending = [], {}
    for i in order:
        bucket = sum(frames[i] >= b for b in boundaries)
        pending.setdefault(bucket, []).append(i)
        if len(pending[bucket]) == [*sizes, 1][bucket]:
            batches.append(pending.pop(bucket))
    return batches + [pending[b] for b in sorted(pending)]


@pytest.mark.parametrize("seed,epoch", [(0, 0), (0, 1), (3, 0)])
def test_an_epoch_is_every_utterance_once_bucketed_as_a_stream(seed, epoch):
    frames = np.random.default_rng(1).integers(10, 500, size=257)
    boundaries, sizes = [100, 200, 400], [9, 5, 2]
    plan = epoch_order(frames, boundaries, sizes, seed=seed, epoch=epoch)
    order = np.concatenate(plan)
    assert sorted(order.tolist()) == list(range(len(frames)))
    permutation = np.random.default_rng(order_seed(seed, epoch)).permutation(len(frames))
    expected = _stream_bucketing(frames, permutation.tolist(), boundaries, sizes)
    assert [b.tolist() for b in plan] == expected
    same = epoch_order(frames, boundaries, sizes, seed=seed, epoch=epoch)
    other = epoch_order(frames, boundaries, sizes, seed=seed, epoch=epoch + 1)
    assert all(np.array_equal(a, b) for a, b in zip(plan, same, strict=True))
    assert any(not np.array_equal(a, b) for a, b in zip(plan, other, strict=False))


def test_resuming_reads_nothing_before_the_resume_point(tmp_path, monkeypatch):
    files, lengths = fake_shards(tmp_path, n=90)
    config = PipelineConfig(batch_seconds=6.0, num_buckets=4, freq_warp=0.1)
    plan = bucket_plan(lengths, config)
    whole = [tuple(t.numpy() for t in b) for b in
             make_dataset(files, config, *plan, training=True, seed=5, epoch=2)]  # fmt: skip
    skip = len(whole) // 2
    index = index_shards(files)
    order = epoch_order(index.frames, *plan, seed=5, epoch=2)
    # Corrupt every record of the skipped micro-batches: a resume must never read them.
    consumed = np.concatenate(order[:skip])
    for i in consumed:
        with open(index.files[index.file[i]], "r+b") as f:
            f.seek(int(index.offset[i]))
            f.write(b"\xff" * int(index.size[i]))
    resumed = make_dataset(files, config, *plan, training=True, seed=5, epoch=2,
                           skip_batches=skip, index=index)  # fmt: skip
    rest = [tuple(t.numpy() for t in b) for b in resumed]
    assert len(rest) == len(whole) - skip
    for a, b in zip(rest, whole[skip:], strict=True):  # augmentation included
        for x, y in zip(a, b, strict=True):
            np.testing.assert_array_equal(x, y)
    with pytest.raises(Exception):  # noqa: B017 (whichever way parsing garbage fails)
        list(make_dataset(files, config, *plan, training=True, seed=5, epoch=2, index=index))


def test_the_pipeline_reads_only_a_few_micro_batches_ahead(tmp_path, monkeypatch):
    files, lengths = fake_shards(tmp_path, n=400)
    config = PipelineConfig(batch_seconds=20.0, num_buckets=3)  # 5 to 50 utterances each
    plan = bucket_plan(lengths, config)
    reads = []
    original = pipeline._RecordReader.read
    monkeypatch.setattr(pipeline._RecordReader, "read",
                        lambda self, *a: reads.append(a) or original(self, *a))  # fmt: skip
    dataset = make_dataset(files, config, *plan, training=True)
    iterator = iter(dataset)
    next(iterator)
    time.sleep(1.0)  # the prefetch fills in the background: give it time
    index = index_shards(files)
    order = epoch_order(index.frames, *plan, seed=0, epoch=0)
    held = sum(len(b) for b in order[: pipeline.prefetched_micro_batches()])
    # The consumed micro-batch, the held ones (one of the bound's four stands for the
    # utterances prepared ahead), and those utterances.
    assert len(order) > 3 * pipeline.prefetched_micro_batches()
    assert len(order[0]) < len(reads) <= held + pipeline.PREPARED_AHEAD


def test_a_changed_plan_is_named():
    old = DataPlanKey("abc", (10, 20), (4, 2), 0)
    assert changed_keys(old, old) == []
    new = DataPlanKey("abc", (10, 20), (8, 4), 1)
    assert changed_keys(old, new) == [
        "the micro-batch sizes (data.batch_seconds, or the replica count)",
        "train.seed",
    ]
    assert DataPlanKey.from_dict(json.loads(json.dumps(new.as_dict()))) == new
