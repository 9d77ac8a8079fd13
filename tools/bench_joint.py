"""Benchmark the lean training step: plain joint + loss, fused, fused + recomputed encoder
blocks, the pruned RNN-T loss (band fused or not, with or without recomputation) and the
fused TDT loss.

For the Conformer-S shape (`recipes/librispeech/conf/conformer_s.yaml`), one micro-batch of
B utterances x S seconds with U labels, and each vocabulary size: the extra peak tensor
memory of one training step and its time (median of the timed steps), side by side. Memory
is TensorFlow's own count: the CPU allocator switched to the BFC allocator GPUs use
(TF_CPU_ALLOCATOR_USE_BFC), its peak during the timed steps minus what was allocated before
them (after a warm-up step; a fresh subprocess per configuration, oneDNN off). Unlike the
process' VmHWM it has no malloc or thread-arena noise; what remains is the executor's op
order (which tensors happen to be alive together): a few MiB between runs.
With the `encoder` mode (the same step with the encoder's frames' mean square as the whole
loss: no predictor, joint or transducer loss), a second table gives each mode's joint +
loss part: its memory and time minus the encoder's, and the ratios fused / pruned.

With `--hwm`, each cell also gives the process' memory high-water mark during a first step
above its resident size just before it (VmHWM, as `top` would show it), in a fresh process.

    python tools/bench_joint.py [--batch 2] [--seconds 20] [--labels 80] [--vocab 64,1024,5000]
        [--modes encoder,plain,fused,fused+recompute,pruned,pruned-plain,pruned+recompute,tdt]
        [--config conf.yaml] [--set loss.chunk_mb=16 ...] [--hwm]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import child_request, reply, run_child

CONFORMER_S = Path(__file__).resolve().parents[1] / "recipes/librispeech/conf/conformer_s.yaml"
MODES = {
    "plain": {"loss.fused": False},
    "fused": {"loss.fused": True},
    "fused+recompute": {"loss.fused": True, "model.encoder.recompute": True},
    "pruned": {"loss.kind": "pruned", "loss.fused": True},
    "pruned-plain": {"loss.kind": "pruned", "loss.fused": False},
    "encoder": {},
    "pruned+recompute": {"loss.kind": "pruned", "model.encoder.recompute": True},
    # the TDT loss (fused) of the same network with a TDT joint of NeMo's durations
    "tdt": {"loss.kind": "tdt", "model.durations": "[0,1,2,3,4]", "loss.sigma": 0.05},
}


# What RESULTS.md records for the default shape (conformer_s.yaml, 2 x 20 s, U = 80): the
# extra allocator peak's range over seven processes and the first step's VmHWM, 2026-12-07.
RECORDED = {("fused", 1024): "recorded 950-1021 MiB, VmHWM +1431-1440 MiB"}


def run(
    mode: str,
    vocab: int,
    batch: int,
    seconds: float,
    labels: int,
    steps: int,
    config: str = str(CONFORMER_S),
    overrides: tuple[str, ...] = (),
    hwm: bool = False,
) -> dict:
    import keras
    import numpy as np
    import tensorflow as tf

    from asrkit.config import load_config
    from asrkit.data.pipeline import without_autotuning
    from asrkit.models.transducer import Transducer
    from asrkit.training.memory_meter import allocator_peak
    from asrkit.training.task import TransducerTask

    class EncoderOnlyTask(TransducerTask):
        """The floor of any loss: the encoder's forward and backward pass alone."""

        def compute_loss_terms(self, data, training=True):
            features, feature_lengths = data[:2]
            encoded, _ = self.network.encode(features, feature_lengths, training=training)
            return tf.reduce_mean(tf.square(tf.cast(encoded, tf.float32))), 1

    mode_overrides = [f"{k}={str(v).lower()}" for k, v in MODES[mode].items()]
    experiment = load_config(config, [*mode_overrides, *overrides])
    frames = int(seconds * 100)
    rng = np.random.default_rng(0)
    data = (
        rng.standard_normal((batch, frames, 80)).astype(np.float32),
        np.full(batch, frames, np.int32),
        rng.integers(1, vocab, (batch, labels)).astype(np.int32),
        np.full(batch, labels, np.int32),
    )
    keras.utils.set_random_seed(0)
    kind = EncoderOnlyTask if mode == "encoder" else TransducerTask
    task = kind(Transducer(vocab, experiment.model), experiment.loss)
    task.compile(keras.optimizers.AdamW(1e-4), accumulation_steps=1)
    task.build_engine(data)
    dataset = without_autotuning(tf.data.Dataset.from_tensors(data))
    if hwm:  # the process' high-water mark of its first step above its size just before
        resting = _status_mib("VmRSS")
        Path("/proc/self/clear_refs").write_text("5")  # resets VmHWM to the current size
        task.fit(dataset, verbose=0)
        return {"hwm_mib": _status_mib("VmHWM") - resting}
    task.fit(dataset, verbose=0)  # warm-up: tracing and the first allocation
    times = []

    def timed_steps():
        for _ in range(steps):
            start = time.perf_counter()
            task.fit(dataset, verbose=0)
            times.append(time.perf_counter() - start)

    extra = allocator_peak(timed_steps)
    return {"extra_mib": extra / 2**20, "seconds": statistics.median(times)}


def _status_mib(field: str) -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"/proc/self/status has no {field}")


def main() -> None:
    request = child_request()
    if request is not None:
        reply(run(**request))
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--labels", type=int, default=80)
    parser.add_argument("--vocab", default="64,1024,5000")
    parser.add_argument("--steps", type=int, default=2, help="timed steps per configuration")
    parser.add_argument("--modes", default="plain,fused,fused+recompute")
    parser.add_argument("--config", default=str(CONFORMER_S), help="YAML whose model: to use")
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a config override for every mode (repeatable)",
    )
    parser.add_argument(
        "--hwm", action="store_true",
        help="also the process' memory high-water mark of a first step above its size just "
             "before it (VmHWM, Linux; what a user's `top` sees), each in a process of its own",
    )  # fmt: skip
    args = parser.parse_args()
    modes = args.modes.split(",")
    print(f"{Path(args.config).name}, {args.batch} x {args.seconds:.0f} s, U = {args.labels}, "
          f"float32{''.join(' ' + o for o in args.set)}: "
          "extra peak tensor memory of one step / step time")  # fmt: skip
    print(f"{'V':>6} | " + " | ".join(f"{m:>22}" for m in modes))
    results = {}
    for vocab in [int(v) for v in args.vocab.split(",")]:
        cells = []
        for mode in modes:
            spec = dict(mode=mode, vocab=vocab, batch=args.batch, seconds=args.seconds,
                        labels=args.labels, steps=args.steps, config=args.config,
                        overrides=args.set)  # fmt: skip
            r = results[vocab, mode] = run_child(__file__, spec)
            cells.append(f"{r['extra_mib']:7.0f} MiB {r['seconds']:7.2f} s")
            if args.hwm:
                r["hwm_mib"] = run_child(__file__, {**spec, "hwm": True})["hwm_mib"]
                cells[-1] += f", first step VmHWM +{r['hwm_mib']:.0f} MiB"
            default = (args.batch, args.seconds, args.labels, args.config, args.set) == (
                2, 20.0, 80, str(CONFORMER_S), [])  # fmt: skip
            if default and (mode, vocab) in RECORDED:
                cells[-1] += f" ({RECORDED[mode, vocab]})"
        print(f"{vocab:>6} | " + " | ".join(f"{c:>22}" for c in cells), flush=True)
    if "encoder" in modes:
        _joint_table(results, [m for m in modes if m != "encoder"])


def _joint_table(results: dict, modes: list[str]) -> None:
    """Each mode minus the encoder alone: what the joint and the loss add."""
    print("\njoint + loss only (minus the encoder-only step): memory / time")
    ratio = "fused" in modes and "pruned" in modes
    print(f"{'V':>6} | " + " | ".join(f"{m:>22}" for m in modes)
          + (" | fused / pruned" if ratio else ""))  # fmt: skip
    for vocab in sorted({v for v, _ in results}):
        floor = results[vocab, "encoder"]
        part = {m: {k: results[vocab, m][k] - floor[k] for k in floor} for m in modes}
        cells = [f"{p['extra_mib']:7.0f} MiB {p['seconds']:7.2f} s" for p in part.values()]
        line = f"{vocab:>6} | " + " | ".join(f"{c:>22}" for c in cells)
        if ratio:
            f, p = part["fused"], part["pruned"]
            step = results[vocab, "fused"]["seconds"] / results[vocab, "pruned"]["seconds"]
            memory = f["extra_mib"] / max(p["extra_mib"], 1)
            time_ = f["seconds"] / max(p["seconds"], 1e-3)
            line += f" | memory {memory:.1f}x, time {time_:.1f}x; whole step {step:.1f}x"
        print(line, flush=True)


if __name__ == "__main__":
    main()
