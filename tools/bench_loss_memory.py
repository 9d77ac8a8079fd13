"""Peak tensor memory of the transducer loss alone — fused full vs pruned — side by side.

One forward + backward of the loss (and of the joint's projections into it) on fixed
encoder and predictor outputs of the Conformer-S shapes (encoder 144, predictor and joint
320), for each batch size: the gradients of the inputs and of every weight the loss
touches (the output layer; the pruned loss' two simple projections) included, the encoder
and predictor networks not. Memory is TensorFlow's own count (the BFC allocator switched on
for CPU): the peak during the timed call minus what was allocated before it, in a fresh
process per cell; min–max over `--repeats` processes (the executor's op order moves it by
a few MiB). The whole training step's figures are `tools/bench_joint.py`'s.

    python tools/bench_loss_memory.py [--batches 2,16] [--seconds 20] [--labels 80]
        [--vocab 5000] [--joint-chunk-mb 64] [--pruned-chunk-mb 8] [--repeats 3]
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import child_request, reply, run_child

ENCODER, PREDICTOR, JOINT = 144, 320, 320
LOSSES = ("fused", "pruned")


def run(loss: str, batch: int, frames: int, labels: int, vocab: int, chunk_mb: float) -> float:
    import keras
    import numpy as np
    import tensorflow as tf

    from asrkit.losses import fused_pruned_loss, fused_rnnt_loss, fused_simple_loss, prune_ranges
    from asrkit.training.memory_meter import allocator_peak

    rng = np.random.default_rng(0)
    encoded = tf.constant(rng.standard_normal((batch, frames, ENCODER)), tf.float32)
    predicted = tf.constant(rng.standard_normal((batch, labels + 1, PREDICTOR)), tf.float32)
    label_ids = tf.constant(rng.integers(1, vocab, (batch, labels)), tf.int32)
    frame_counts, label_counts = tf.fill([batch], frames), tf.fill([batch], labels)
    keras.utils.set_random_seed(0)
    enc_proj, pred_proj = keras.layers.Dense(JOINT), keras.layers.Dense(JOINT)
    out, am_proj, lm_proj = (keras.layers.Dense(vocab) for _ in range(3))
    for layer, width in ((enc_proj, ENCODER), (pred_proj, PREDICTOR), (out, JOINT),
                         (am_proj, ENCODER), (lm_proj, PREDICTOR)):  # fmt: skip
        layer.build((None, width))
    chunk_bytes = int(chunk_mb * 2**20)
    lengths = (label_ids, frame_counts, label_counts)

    @tf.function(autograph=False)
    def step(encoded, predicted):
        with tf.GradientTape() as tape:
            tape.watch([encoded, predicted])
            enc_h, pred_h = enc_proj(encoded), pred_proj(predicted)  # the joint's projections
            if loss == "fused":
                losses = fused_rnnt_loss(
                    enc_h,
                    pred_h,
                    *lengths,
                    kernel=out.kernel,
                    bias=out.bias,
                    chunk_bytes=chunk_bytes,
                )
            else:  # as the task computes it, with icefall's default smoothing
                simple, occupancy = fused_simple_loss(
                    encoded, lm_proj(predicted), *lengths, kernel=am_proj.kernel,
                    bias=am_proj.bias, lm_only_scale=0.25, chunk_bytes=chunk_bytes,
                )  # fmt: skip
                s_begin = prune_ranges(occupancy, frame_counts, label_counts, prune_range=5)
                losses = 0.5 * simple + fused_pruned_loss(
                    enc_h, pred_h, *lengths, s_begin=s_begin, prune_range=5, kernel=out.kernel,
                    bias=out.bias, chunk_bytes=chunk_bytes,
                )  # fmt: skip
            total = tf.reduce_sum(losses)
        weights = [v for layer in (enc_proj, pred_proj, out, am_proj, lm_proj)
                   for v in layer.trainable_variables]  # fmt: skip
        grads = tape.gradient(total, [encoded, predicted, *weights])
        return total, [g for g in grads if g is not None]

    step(encoded, predicted)  # tracing and first allocations
    return allocator_peak(lambda: step(encoded, predicted)) / 2**20


def main() -> None:
    request = child_request()
    if request is not None:
        reply(run(**request))
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", default="2,16")
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--labels", type=int, default=80)
    parser.add_argument("--vocab", type=int, default=5000)
    parser.add_argument("--joint-chunk-mb", type=float, default=64.0)
    parser.add_argument("--pruned-chunk-mb", type=float, default=8.0)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    frames = int(args.seconds * 25)  # the encoder's 40 ms frames
    budget = {"fused": args.joint_chunk_mb, "pruned": args.pruned_chunk_mb}
    print(f"loss alone, T = {frames}, U = {args.labels}, V = {args.vocab}, float32: peak tensor "
          f"memory, min-max of {args.repeats} processes (chunk budgets: fused "
          f"{args.joint_chunk_mb:g} MiB, pruned {args.pruned_chunk_mb:g} MiB)")  # fmt: skip
    print(f"{'B':>4} | " + " | ".join(f"{loss:>17}" for loss in LOSSES) + " | fused / pruned")
    for batch in [int(b) for b in args.batches.split(",")]:
        cells = {}
        for loss in LOSSES:
            spec = dict(loss=loss, batch=batch, frames=frames, labels=args.labels,
                        vocab=args.vocab, chunk_mb=budget[loss])  # fmt: skip
            cells[loss] = sorted(run_child(__file__, spec) for _ in range(args.repeats))
        text = [f"{c[0]:6.1f}-{c[-1]:6.1f} MiB" for c in cells.values()]
        fused, pruned = (statistics.median(cells[loss]) for loss in LOSSES)
        line = f"{batch:>4} | " + " | ".join(f"{t:>17}" for t in text)
        print(f"{line} | {fused / pruned:.1f}x (medians)", flush=True)


if __name__ == "__main__":
    main()
