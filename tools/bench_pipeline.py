"""Benchmark the data path on the mini synthetic corpus.

Prints: feature extraction real-time factor per core (log-mel of real-length utterances, one
thread); pipeline throughput (utterances and audio seconds per second, training mode with
shuffling and SpecAugment); padding efficiency (real frames / padded frames) of bucketed
batches vs padding each batch to its own max vs padding to the global max.

    python tools/bench_pipeline.py [--work /tmp/asrkit-bench] [--batch-seconds 60]
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work", default="/tmp/asrkit-bench-pipeline")
    parser.add_argument("--batch-seconds", type=float, default=60.0)
    args = parser.parse_args()
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

    import numpy as np
    import tensorflow as tf

    from asrkit.audio import read_audio
    from asrkit.data.librispeech import prepare_librispeech
    from asrkit.data.manifest import read_manifest
    from asrkit.data.pipeline import PipelineConfig, bucket_plan, make_dataset
    from asrkit.data.records import parse_example, write_shards
    from asrkit.data.synthetic import make_synthetic_corpus
    from asrkit.features import log_mel
    from asrkit.tokenizer import train_tokenizer

    work = Path(args.work)
    corpus, data = work / "corpus", work / "data"
    if not (corpus / "SPEAKERS.TXT").exists():
        make_synthetic_corpus(corpus, "mini", seed=0)
    manifest = data / "train-clean-100.jsonl"
    if not manifest.exists():
        prepare_librispeech(corpus, ["train-clean-100"], data)
    utts = read_manifest(manifest)

    tf.config.threading.set_intra_op_parallelism_threads(1)
    waves = [read_audio(u.audio_path) for u in utts[:200]]
    log_mel(waves[0])  # warm-up
    start = time.perf_counter()
    for w in waves:
        log_mel(w)
    seconds = sum(len(w) for w in waves) / 16000
    rtf = (time.perf_counter() - start) / seconds
    print(f"feature extraction: RTF {rtf:.4f} per core ({1 / rtf:.0f}x real time), 200 utterances")

    tok_dir, shard_dir = work / "tok", work / "shards"
    if not (tok_dir / "tokenizer.model").exists():
        train_tokenizer([u.text for u in utts], tok_dir, 64, "unigram")
    if not any(shard_dir.glob("*.tfrecord")):
        from asrkit.tokenizer import Tokenizer

        write_shards(manifest, Tokenizer.load(tok_dir), shard_dir, num_shards=8)
    files = sorted(str(p) for p in shard_dir.glob("*.tfrecord"))
    lengths = np.array(
        [int(e["feature_lengths"]) for e in tf.data.TFRecordDataset(files).map(
            lambda r: parse_example(r, 80))]
    )  # fmt: skip
    config = PipelineConfig(batch_seconds=args.batch_seconds)
    plan = bucket_plan(lengths, config)
    dataset = make_dataset(files, config, *plan, training=True, seed=0)
    for _ in dataset.take(2):
        pass
    start = time.perf_counter()
    n_utts = frames = padded = 0
    for batch in make_dataset(files, config, *plan, training=True, seed=0, epoch=1):
        n_utts += int(batch.feature_lengths.shape[0])
        frames += int(tf.reduce_sum(batch.feature_lengths))
        padded += int(batch.features.shape[0] * batch.features.shape[1])
    elapsed = time.perf_counter() - start
    print(
        f"pipeline: {n_utts / elapsed:.0f} utterances/s, {frames / 100 / elapsed:.0f} audio s/s "
        f"({len(files)} shards, batch budget {args.batch_seconds:.0f} s, training mode)"
    )

    # The same utterances in the same batch sizes, padded two other ways.
    rng = np.random.default_rng(0)
    order = rng.permutation(lengths)
    size = max(1, int(np.median(plan[1])))
    batch_max = sum(len(b) * b.max() for b in np.array_split(order, len(order) // size))
    print(
        f"padding efficiency (real/padded frames): bucketed {frames / padded:.3f}, "
        f"pad-to-batch-max {lengths.sum() / batch_max:.3f}, "
        f"pad-to-global-max {lengths.sum() / (len(lengths) * lengths.max()):.3f}"
    )


if __name__ == "__main__":
    main()
