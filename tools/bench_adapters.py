"""Fine-tuning methods side by side on one model: what trains, the training state, one
update's time and (with --memory) its allocator peak.

Methods: `full` (every weight, the config's optimizer), `frozen_half` (the first half of
the encoder's blocks frozen), `lora` (model.adapters lora, rank --rank, on the attention
and feed-forward linears) and `lora_all` (also the convolution's pointwise linears and the
joint). Each update is one micro-batch of --batch random utterances of --seconds with
--labels labels (forward, backward, optimizer), timed in this process after a warm-up
(median and range of --repeats), the methods in turn, repeated --rounds times in
alternation so that a slow spell of the machine falls on all of them. The peak is
TensorFlow's allocator peak of the same step in a child process (`asrkit.training.
memory_meter`, the method of `asrkit plan`), weights, slots and accumulators included.

    python tools/bench_adapters.py --config recipes/finetune/conf/fastconformer_rnnt_114m.yaml \\
        --vocab 1025 [--memory] [--set train.precision=mixed_bfloat16]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

METHODS = ("full", "frozen_half", "lora", "lora_all")


def overrides(method: str, blocks: int, rank: int) -> list[str]:
    lora = ["model.adapters.kind=lora", f"model.adapters.rank={rank}"]
    return {
        "full": [],
        "frozen_half": [f"train.freeze_encoder={blocks // 2}"],
        "lora": lora,
        "lora_all": [*lora, "model.adapters.targets=[attention, feed_forward, convolution, joint]"],
    }[method]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", required=True)
    parser.add_argument("--vocab", type=int, default=1025)
    parser.add_argument("--methods", default=",".join(METHODS))
    parser.add_argument("--rank", type=int, default=8)
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--labels", type=int, default=40)
    parser.add_argument("--repeats", type=int, default=3, help="timed updates per round")
    parser.add_argument("--rounds", type=int, default=2, help="alternations of the methods")
    parser.add_argument("--memory", action="store_true", help="measure each step's peak too")
    parser.add_argument("--set", dest="sets", action="append", default=[])
    args = parser.parse_args()
    methods = args.methods.split(",")
    if unknown := sorted(set(methods) - set(METHODS)):
        parser.error(f"--methods: unknown {unknown} (known: {', '.join(METHODS)})")
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

    import numpy as np
    import tensorflow as tf

    from asrkit.config import load_config
    from asrkit.data.pipeline import without_autotuning
    from asrkit.sizes import format_bytes
    from asrkit.training.setup import build_task, process_settings
    from asrkit.training.state_size import training_state

    base = load_config(args.config, args.sets)
    blocks = base.model.encoder.num_blocks
    configs = {m: load_config(args.config, [*args.sets, *overrides(m, blocks, args.rank)])
               for m in methods}  # fmt: skip
    mel = base.features.num_mel_bins
    frames = int(args.seconds * 100)
    rng = np.random.default_rng(0)
    batch = (
        rng.standard_normal((args.batch, frames, mel)).astype(np.float32),
        np.full(args.batch, frames, np.int32),
        rng.integers(1, args.vocab, (args.batch, args.labels)).astype(np.int32),
        np.full(args.batch, args.labels, np.int32),
    )
    data = without_autotuning(tf.data.Dataset.from_tensors(batch))
    tasks, times, rows = {}, {m: [] for m in methods}, {}
    for method, config in configs.items():
        state = training_state(config, args.vocab)
        with process_settings(config):
            task = build_task(config, args.vocab, steps=1)
            task.build_engine(batch)
            task.fit(data, verbose=0)  # traces and warms up
        tasks[method] = (task, config)
        rows[method] = state
        print(f"{method}: built, {state.trainable_parameters / 1e6:.2f} M trained", flush=True)
    for _ in range(args.rounds):
        for method, (task, config) in tasks.items():
            with process_settings(config):
                for _ in range(args.repeats):
                    start = time.perf_counter()
                    task.fit(data, verbose=0)
                    times[method].append(time.perf_counter() - start)
    peaks = {}
    if args.memory:
        from asrkit.training.memory_meter import MemoryMeter

        for method, config in configs.items():
            with MemoryMeter(config, args.vocab) as meter:
                peaks[method] = meter.peak(args.batch, frames, args.labels)
    full = statistics.median(times[methods[0]])
    print(f"\n{args.config} ({', '.join(args.sets) or 'as configured'}), one update of "
          f"{args.batch} x {args.seconds:g} s, U {args.labels}, V {args.vocab}; "
          f"{args.rounds} x {args.repeats} updates per method\n")  # fmt: skip
    head = "| method | trained parameters | training state | update (median, range) | vs " \
           f"{methods[0]} |" + (" step peak (allocator) |" if peaks else "")  # fmt: skip
    print(head)
    print("|---" * (head.count("|") - 1) + "|")
    for method in methods:
        state, spread = rows[method], times[method]
        median = statistics.median(spread)
        cells = [
            method,
            f"{state.trainable_parameters / 1e6:.2f} M of {state.parameters / 1e6:.1f} M",
            format_bytes(state.total),
            f"{median:.3f} s ({min(spread):.3f}-{max(spread):.3f})",
            f"{median / full:.2f}x",
        ]
        if peaks:
            peak = peaks[method]
            cells.append("out of memory" if peak is None else format_bytes(peak))
        print("| " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
