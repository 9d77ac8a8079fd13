"""The training input pipeline at LibriSpeech scale: host memory, throughput, resume latency.

Generates shards of random log-mel features with LibriSpeech-like lengths (utterances of
~12.3 s on average, 1-35 s; ~3 tokens per second), then measures, each in a fresh
process, the pipeline of this checkout ("after") and the one of an earlier commit
("before", read with `git show`), side by side:

* peak host RSS and input throughput over a whole epoch (utterances/s, audio s/s);
* resume latency: the time from "resume at micro-batch k" to the first micro-batch, at
  10 % and 90 % of the epoch.

    python tools/bench_pipeline_scale.py [--utterances 20000] [--before ad90130]
        [--batch-seconds 800] [--shuffle-buffer 20000] [--work /tmp/asrkit-bench-scale]

The defaults are the LibriSpeech Conformer-S recipe's (800 s micro-batches; the before
pipeline's 20000-utterance shuffle buffer). 20000 utterances is ~7.9 GB of shards.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def generate(work: Path, utterances: int, shards: int, bins: int) -> None:
    import numpy as np
    import tensorflow as tf

    from asrkit.data.records import serialize_example

    done = work / "shards" / "done.json"
    if done.exists() and json.loads(done.read_text()) == [utterances, shards, bins]:
        return
    out = work / "shards"
    out.mkdir(parents=True, exist_ok=True)
    for old in out.glob("*"):
        old.unlink()
    rng = np.random.default_rng(0)
    seconds = np.clip(rng.gamma(12.0, 12.3 / 12.0, utterances), 1.0, 35.0)
    frames = (seconds * 100).astype(int)
    block = rng.standard_normal((4096, bins)).astype(np.float32)  # features: rolled noise
    counts = [{"frames": [], "tokens": []} for _ in range(shards)]
    writers = [tf.io.TFRecordWriter(str(out / f"shard-{i:05d}.tfrecord")) for i in range(shards)]
    for i, n in enumerate(frames):
        feats = np.roll(block, i, axis=0)[np.arange(n) % len(block)]
        tokens = max(1, int(n / 100 * 3))
        labels = rng.integers(1, 1024, tokens).tolist()
        writers[i % shards].write(serialize_example(f"u{i}", feats, labels, n / 100))
        counts[i % shards]["frames"].append(int(n))
        counts[i % shards]["tokens"].append(tokens)
    for i, writer in enumerate(writers):
        writer.close()
        (out / f"shard-{i:05d}.lengths.json").write_text(json.dumps(counts[i]))
    done.write_text(json.dumps([utterances, shards, bins]))


def _pipeline_module(before: str | None):
    """This checkout's pipeline, or the one of commit `before` loaded from git."""
    import types

    if before is None:
        from asrkit.data import pipeline

        return pipeline
    source = subprocess.run(["git", "-C", str(REPO), "show", f"{before}:asrkit/data/pipeline.py"],
                            check=True, capture_output=True, text=True).stdout  # fmt: skip
    module = types.ModuleType("pipeline_before")
    sys.modules[module.__name__] = module  # dataclasses look their module up
    exec(compile(source, f"{before}:asrkit/data/pipeline.py", "exec"), module.__dict__)
    return module


def measure(args) -> dict:
    """One measurement in this process (run as a child): prints a JSON line."""
    import resource

    import numpy as np

    from asrkit.data.records import shard_counts

    pipeline = _pipeline_module(args.before if args.version == "before" else None)
    files, frames, _ = shard_counts(args.work / "shards")
    extra = {"shuffle_buffer": args.shuffle_buffer} if args.version == "before" else {}
    config = pipeline.PipelineConfig(batch_seconds=args.batch_seconds, num_buckets=8, **extra)
    plan = pipeline.bucket_plan(frames, config)
    sizes = [*plan[1], 1]
    buckets = np.searchsorted(np.asarray(plan[0]), frames, side="right")
    total = int(sum(-(-np.sum(buckets == b) // s) for b, s in enumerate(sizes)))
    skip = round(args.resume * total)
    start = time.perf_counter()
    dataset = pipeline.make_dataset(files, config, *plan, training=True, seed=0, epoch=0,
                                    skip_batches=skip, num_mel_bins=args.bins)  # fmt: skip
    iterator = iter(dataset)
    first = next(iterator)
    first_seconds = time.perf_counter() - start
    result = {"version": args.version, "resume": args.resume, "first_batch_s": first_seconds}
    if args.resume == 0:
        count, audio = int(first.feature_lengths.shape[0]), float(np.sum(first.feature_lengths))
        for batch in iterator:
            count += int(batch.feature_lengths.shape[0])
            audio += float(np.sum(batch.feature_lengths))
        elapsed = time.perf_counter() - start
        result.update(utterances=count, seconds=elapsed, utt_per_s=count / elapsed,
                      audio_s_per_s=audio / 100 / elapsed)  # fmt: skip
    result["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(json.dumps(result), flush=True)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--utterances", type=int, default=20000)
    parser.add_argument("--shards", type=int, default=32)
    parser.add_argument("--bins", type=int, default=80)
    parser.add_argument("--batch-seconds", type=float, default=800.0)
    parser.add_argument("--shuffle-buffer", type=int, default=20000, help="the before pipeline's")
    parser.add_argument("--before", default="ad90130", help="commit of the 'before' pipeline")
    parser.add_argument("--work", type=Path, default=Path("/tmp/asrkit-bench-scale"))
    parser.add_argument("--version", choices=["before", "after"], help=argparse.SUPPRESS)
    parser.add_argument("--resume", type=float, default=0.0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    if args.version:
        measure(args)
        return
    args.work.mkdir(parents=True, exist_ok=True)
    t = time.perf_counter()
    generate(args.work, args.utterances, args.shards, args.bins)
    print(f"shards: {args.utterances} utterances in {args.work / 'shards'} "
          f"({time.perf_counter() - t:.0f} s to make or find)", flush=True)  # fmt: skip
    results = {}
    for version in ("before", "after"):
        for resume in (0.0, 0.1, 0.9):
            command = [sys.executable, __file__, "--version", version, "--resume", str(resume),
                       "--work", str(args.work), "--bins", str(args.bins), "--before", args.before,
                       "--batch-seconds", str(args.batch_seconds),
                       "--shuffle-buffer", str(args.shuffle_buffer)]  # fmt: skip
            run = subprocess.run(command, capture_output=True, text=True)
            lines = [x for x in run.stdout.splitlines() if x.startswith("{")]
            if run.returncode or not lines:
                print(f"{version} resume {resume}: failed\n{run.stderr[-2000:]}", flush=True)
                continue
            results[version, resume] = json.loads(lines[-1])
            print(f"  {version:6s} resume at {resume:.0%}: {lines[-1]}", flush=True)
    print(
        f"\n{args.utterances} utterances, micro-batches of {args.batch_seconds:.0f} s, before = "
        f"{args.before} (shuffle buffer {args.shuffle_buffer}), after = this checkout"
    )
    print(f"{'':34s}{'before':>14s}{'after':>14s}")
    rows = [
        ("peak host RSS, whole epoch (MB)", 0.0, "peak_rss_mb", "{:.0f}"),
        ("input throughput (utterances/s)", 0.0, "utt_per_s", "{:.1f}"),
        ("input throughput (audio s/s)", 0.0, "audio_s_per_s", "{:.0f}"),
        ("first micro-batch, fresh epoch (s)", 0.0, "first_batch_s", "{:.1f}"),
        ("resume at 10 % of the epoch (s)", 0.1, "first_batch_s", "{:.1f}"),
        ("resume at 90 % of the epoch (s)", 0.9, "first_batch_s", "{:.1f}"),
        ("peak host RSS, resume at 90 % (MB)", 0.9, "peak_rss_mb", "{:.0f}"),
    ]
    for label, resume, key, fmt in rows:
        cells = []
        for version in ("before", "after"):
            value = results.get((version, resume), {}).get(key)
            cells.append("failed" if value is None else fmt.format(value))
        print(f"{label:34s}{cells[0]:>14s}{cells[1]:>14s}")


if __name__ == "__main__":
    main()
