"""The LibriSpeech README's per-GPU micro-batch table, from `asrkit plan`'s memory model.

LibriSpeech itself is not on this machine, so the buckets come from LibriSpeech-like
lengths (a gamma distribution: mean 12.3 s,
1-35 s; `--tokens-per-second` labels, padded as training pads them). Each bucket's
training step is *measured* (`MemoryMeter`: the real model, AdamW slots and accumulation
buffers, forward + backward, TensorFlow's allocator peak) at `--sizes` utterances on the
device given (CPU here), the per-bucket line is fitted exactly as `asrkit plan` fits it,
and the line predicts the largest micro-batch for each card size with the plan's margin.

    python tools/plan_table.py --config recipes/librispeech/conf/conformer_s.yaml \
        --vocab 1024 --buckets 4 --set train.precision=float32

With `--lengths 10 20 30` the buckets are micro-batches of utterances of exactly those
lengths instead, and each row gives, per length, the utterances that fit and the
micro-batches an update of `train.effective_batch_seconds` then takes (the fine-tuning
recipe's table for large models).

Measured on a CPU, these are estimates for a GPU (other kernels, workspace, allocator
rounding): `asrkit plan` on the card itself replaces them.
"""

from __future__ import annotations

import argparse
import math
import time

import numpy as np

from asrkit.config import load_config
from asrkit.data.batch_plan import MemoryPlan, PlannedBucket, memory_fingerprint
from asrkit.sizes import format_bytes
from asrkit.training.memory_meter import MemoryMeter
from asrkit.training.memory_plan import (
    DEFAULT_MARGIN,
    fit_line,
    predicted_micro_batch,
    probe_buckets,
    summarize,
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", required=True)
    parser.add_argument("--vocab", type=int, default=1024)
    parser.add_argument("--gpus", type=float, nargs="+", default=[8, 12, 16, 24, 40, 80],
                        help="card sizes in GB (decimal, as sold)")  # fmt: skip
    parser.add_argument("--utterances", type=int, default=20000)
    parser.add_argument("--tokens-per-second", type=float, default=4.0)
    parser.add_argument("--buckets", type=int, default=6, help="buckets measured (fewer is faster)")
    # one utterance is the noisiest point (the executor's buffer reuse varies most there)
    parser.add_argument("--sizes", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--lengths", type=float, nargs="+", metavar="SECONDS",
                        help="measure utterances of these lengths instead of buckets")  # fmt: skip
    parser.add_argument("--set", dest="overrides", action="append", default=[])
    args = parser.parse_args()
    if args.lengths:
        return by_length(args)

    config = load_config(args.config, [*args.overrides, f"data.num_buckets={args.buckets}"])
    rng = np.random.default_rng(0)
    seconds = np.clip(rng.gamma(12.0, 12.3 / 12.0, args.utterances), 1.0, 35.0)
    frames = np.round(seconds * 100).astype(np.int64)
    tokens = np.ceil(seconds * args.tokens_per_second).astype(np.int64)
    probes = probe_buckets(config, frames, tokens)
    started = time.monotonic()
    buckets = []
    with MemoryMeter(config, args.vocab) as meter:
        print(f"baseline (weights, AdamW slots, accumulators): {format_bytes(meter.baseline)}")
        for probe in probes:
            points = {n: meter.peak(n, probe.boundary - 1, probe.tokens) for n in args.sizes}
            fixed, slope = fit_line(points)
            print(
                f"bucket <= {(probe.boundary - 1) / 100:5.1f} s, {probe.tokens} tokens: "
                + ", ".join(f"{n} utt {format_bytes(v)}" for n, v in points.items())
                + f" -> {format_bytes(fixed)} + {format_bytes(slope)} per utterance",
                flush=True,
            )
            first = min(points)
            bucket = PlannedBucket(probe.boundary, probe.tokens, probe.utterances, first,
                                   int(points[first]), None, fixed, slope)  # fmt: skip
            buckets.append(bucket)
    print(f"measured in {time.monotonic() - started:.0f} s\n")
    target = config.train.effective_batch_seconds
    header = [f"<= {(b.boundary - 1) / 100:.0f} s" for b in buckets]
    print(f"| GPU | {' | '.join(header)} | mean micro-batch | micro-batches per {target:.0f} s |")
    print("|---" * (len(header) + 3) + "|")
    for gb in args.gpus:
        budget = int(gb * 1e9)
        sizes = [predicted_micro_batch(b, budget, DEFAULT_MARGIN) for b in buckets]
        if target:  # as `asrkit plan`: never more than one update's audio
            sizes = [min(s, int(target // ((b.boundary - 1) / 100))) for b, s in
                     zip(buckets, sizes, strict=True)]  # fmt: skip
        if min(sizes) == 0:
            print(f"| {gb:g} GB | " + " | ".join(str(s) for s in sizes) + " | does not fit | |")
            continue
        plan = MemoryPlan(
            "estimate", budget, DEFAULT_MARGIN,
            tuple(PlannedBucket(**{**b.__dict__, "micro_batch": s})
                  for b, s in zip(buckets, sizes, strict=True)),
            memory_fingerprint(config), 0.01,
        )  # fmt: skip
        summary = summarize(plan, config, frames)
        pairs = zip(buckets, sizes, strict=True)
        cells = [f"{s} ({s * (b.boundary - 1) / 100:.0f} s)" for b, s in pairs]
        steps = math.ceil(target / summary.micro_batch_seconds) if target else 1
        print(
            f"| {gb:g} GB | {' | '.join(cells)} | {summary.micro_batch_seconds:.0f} s | {steps} |"
        )


def by_length(args) -> None:
    from asrkit.training.memory_plan import ProbeBucket
    from asrkit.training.state_size import training_state

    config = load_config(args.config, args.overrides)
    state = training_state(config, args.vocab)
    print(f"training state: {state.describe()}", flush=True)
    multiple = config.data.label_pad_multiple
    started = time.monotonic()
    lines = []
    with MemoryMeter(config, args.vocab) as meter:
        print(f"measured baseline: {format_bytes(meter.baseline)}", flush=True)
        for seconds in args.lengths:
            tokens = math.ceil(seconds * args.tokens_per_second / multiple) * multiple
            probe = ProbeBucket(round(seconds * 100) + 1, tokens, 10**6)
            points = {n: meter.peak(n, probe.boundary - 1, tokens) for n in args.sizes}
            fixed, slope = fit_line(points)
            print(
                f"{seconds:g} s, {tokens} tokens: "
                + ", ".join(f"{n} utt {format_bytes(v)}" for n, v in points.items())
                + f" -> {format_bytes(fixed)} + {format_bytes(slope)} per utterance "
                f"({time.monotonic() - started:.0f} s)",
                flush=True,
            )
            lines.append((seconds, PlannedBucket(probe.boundary, tokens, 10**6, min(points),
                                                 int(points[min(points)]), None, fixed,
                                                 slope)))  # fmt: skip
    target = config.train.effective_batch_seconds or 2000.0
    print("\n| GPU | " + " | ".join(f"{s:g} s utterances" for s, _ in lines) + " |")
    print("|---" * (len(lines) + 1) + "|")
    for gb in args.gpus:
        budget = int(gb * 1e9)
        cells = []
        for seconds, bucket in lines:
            n = predicted_micro_batch(bucket, budget, DEFAULT_MARGIN)
            cells.append(f"{n} x {seconds:g} s, {math.ceil(target / (n * seconds))} per "
                         f"{target:g} s" if n else "does not fit")  # fmt: skip
        print(f"| {gb:g} GB | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
