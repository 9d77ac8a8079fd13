"""Benchmark the data path on the mini synthetic corpus.

Prints: feature extraction real-time factor per core (log-mel of real-length utterances, one
thread); for feature shards and audio shards side by side (three speeds: each a record, or
one drawn per utterance per epoch), their size against the FLAC and the pipeline's
throughput (audio seconds of features per second, training mode with shuffling and
SpecAugment; per core: over the cores this process may use, `taskset -c 0` for one);
padding efficiency (real frames / padded frames) of bucketed batches vs padding each batch
to its own max vs padding to the global max.

    python tools/bench_pipeline.py [--work /tmp/asrkit-bench] [--batch-seconds 60]
        [--corpus LIBRISPEECH_LAYOUT --part dev-clean] [--repeats 3] [--speeds 0.9,1.0,1.1]
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import spread, timed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work", default="/tmp/asrkit-bench-pipeline")
    parser.add_argument("--batch-seconds", type=float, default=60.0)
    parser.add_argument("--corpus", help="a LibriSpeech-layout corpus (default: synthesise the "
                        "mini corpus in --work)")  # fmt: skip
    parser.add_argument("--part", default="train-clean-100", help="the corpus part to read")
    parser.add_argument("--utterances", type=int, default=200, help="featurised per pass")
    parser.add_argument("--vocab", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3, help="timed passes (median)")
    parser.add_argument("--speeds", default="0.9,1.0,1.1")
    parser.add_argument("--stores", default="features,audio",
                        help="the shard kinds to compare (features: each speed a record; "
                        "audio: FLAC, a speed drawn per epoch)")  # fmt: skip
    args = parser.parse_args()
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

    import numpy as np
    import tensorflow as tf

    from asrkit.audio import read_audio
    from asrkit.data.librispeech import prepare_librispeech
    from asrkit.data.manifest import read_manifest
    from asrkit.data.pipeline import PipelineConfig, bucket_plan, make_dataset
    from asrkit.data.records import write_shards
    from asrkit.data.synthetic import make_synthetic_corpus
    from asrkit.features import log_mel
    from asrkit.tokenizer import train_tokenizer

    work = Path(args.work)
    corpus, data = Path(args.corpus) if args.corpus else work / "corpus", work / "data"
    if not args.corpus and not (corpus / "SPEAKERS.TXT").exists():
        make_synthetic_corpus(corpus, "mini", seed=0)
    manifest = data / f"{args.part}.jsonl"
    if not manifest.exists():
        prepare_librispeech(corpus, [args.part], data, show_progress=False)
    utts = read_manifest(manifest)

    tf.config.threading.set_intra_op_parallelism_threads(1)
    waves = [read_audio(u.audio_path) for u in utts[: args.utterances]]
    seconds = sum(len(w) for w in waves) / 16000
    wall = timed(lambda: [log_mel(w) for w in waves], repeats=args.repeats)
    rtf = spread(t / seconds for t in wall)
    print(f"feature extraction: RTF {rtf.format()} per core ({1 / rtf.median:.0f}x real time), "
          f"{len(waves)} utterances")  # fmt: skip

    tok_dir = work / "tok"
    if not (tok_dir / "tokenizer.model").exists():
        train_tokenizer([u.text for u in utts], tok_dir, args.vocab, "unigram")
    from asrkit.config import FeatureConfig
    from asrkit.data.pipeline import index_shards
    from asrkit.data.records import on_the_fly
    from asrkit.tokenizer import Tokenizer

    speeds = tuple(float(s) for s in args.speeds.split(","))
    flac = sum(os.path.getsize(u.audio_path) for u in utts)
    print(f"the FLAC: {flac / 2**20:.1f} MiB, {sum(u.duration for u in utts) / 3600:.2f} h "
          f"({len(utts)} utterances); speeds {args.speeds}; {len(os.sched_getaffinity(0))} "
          "core(s)")  # fmt: skip
    config = PipelineConfig(batch_seconds=args.batch_seconds)
    for store in args.stores.split(","):
        shard_dir = work / f"shards_{store}"
        if not any(shard_dir.glob("*.tfrecord")):
            write_shards(manifest, Tokenizer.load(tok_dir), shard_dir, num_shards=8,
                         speeds=speeds, store=store, show_progress=False)  # fmt: skip
        files = sorted(str(p) for p in shard_dir.glob("*.tfrecord"))
        size = sum(os.path.getsize(f) for f in files)
        audio = on_the_fly(shard_dir, FeatureConfig())
        index = index_shards(files, audio=audio)
        lengths = index.frames
        plan = bucket_plan(lengths, config)
        counts = {}

        def one_epoch(files=files, plan=plan, index=index, audio=audio, counts=counts):
            n_utts = frames = padded = 0
            for batch in make_dataset(files, config, *plan, training=True, seed=0, epoch=1,
                                      index=index, audio=audio):  # fmt: skip
                n_utts += int(batch.feature_lengths.shape[0])
                frames += int(tf.reduce_sum(batch.feature_lengths))
                padded += int(batch.features.shape[0] * batch.features.shape[1])
            counts.update(utterances=n_utts, frames=frames, padded=padded)

        elapsed = timed(one_epoch, repeats=args.repeats, warmup=1)
        rate = spread(counts["frames"] / 100 / t for t in elapsed)  # median, low, high
        print(
            f"{store} shards: {size / 2**20:.1f} MiB ({size / flac:.2f}x the FLAC); an epoch "
            f"of {counts['utterances']} utterances, {counts['frames'] / 360000:.2f} h: "
            f"{rate.format('.0f')} audio s/s ({rate.median / len(os.sched_getaffinity(0)):.0f}"
            f" per core; training mode, median of {args.repeats}), padding efficiency "
            f"{counts['frames'] / counts['padded']:.3f}"
        )
    frames, padded = counts["frames"], counts["padded"]

    # The other place for the log-mel: inside the training step, on the device, from padded
    # waveforms (here the CPU, as one compiled graph per batch of `--batch-seconds`).
    from asrkit.features import compiled_log_mel_batch

    front = compiled_log_mel_batch(FeatureConfig())
    every = [read_audio(u.audio_path) for u in utts]
    order = np.argsort([len(w) for w in every], kind="stable")
    batches, current = [], []
    for i in order:
        current.append(every[i])
        if sum(len(w) for w in current) / 16000 >= args.batch_seconds:
            batches.append(current)
            current = []
    batches += [current] if current else []
    padded_batches = []
    for batch in batches:
        samples = np.array([len(w) for w in batch], np.int32)
        waves = np.zeros((len(batch), samples.max()), np.float32)
        for row, w in enumerate(batch):
            waves[row, : len(w)] = w
        padded_batches.append((tf.constant(waves), tf.constant(samples)))
    elapsed = timed(lambda: [front(w, n) for w, n in padded_batches], repeats=args.repeats)
    total = sum(len(w) for w in every) / 16000
    rate = spread(total / t for t in elapsed)
    print(
        f"log-mel of padded batches in one graph (a step's front end): {rate.format('.0f')} "
        "audio s/s, one intra-op thread (decoded audio, no resampling)"
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
