"""Benchmark asrkit's RNN-T loss against an autodiff-through-the-recursion baseline.

For each shape (B, T, U, V) and each implementation, with and without XLA, prints the median
forward+backward wall time and the extra peak process memory, also as a multiple of the
logits' size. Extra peak = TensorFlow's allocator peak during the timed passes above what it
held before them (after one warm-up pass, which includes tracing/compilation); the gradient
itself (1x the logits) is part of it. Every configuration runs in its own subprocess.

    python tools/bench_rnnt_loss.py                       # the three reference shapes
    python tools/bench_rnnt_loss.py --shapes 4,50,10,64   # a quick look
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import child_request, reply, run_child

DEFAULT_SHAPES = ["8,150,40,256", "16,300,80,512", "16,400,100,1024"]


def _autodiff_baseline(logits, labels, logit_lengths, label_lengths):
    """The textbook TF approach: log_softmax over V, then autodiff through the alpha recursion."""
    import tensorflow as tf

    from asrkit.losses.lattice import LOG_ZERO, log_add, shift_up, skew

    log_probs = tf.nn.log_softmax(logits, axis=-1)
    shape = tf.shape(logits)
    batch, frames, u1 = shape[0], shape[1], shape[2]
    next_label = tf.pad(labels, [[0, 0], [0, 1]])
    log_blank = log_probs[..., 0]
    index = tf.broadcast_to(next_label[:, None, :], [batch, frames, u1])
    log_label = tf.gather(log_probs, index, batch_dims=3)
    t_ok = tf.range(frames)[None, :] < logit_lengths[:, None]
    node = t_ok[:, :, None] & (tf.range(u1)[None, :] <= label_lengths[:, None])[:, None]
    edge = t_ok[:, :, None] & (tf.range(u1)[None, :] < label_lengths[:, None])[:, None]
    blank_d = skew(tf.where(node, log_blank, LOG_ZERO), LOG_ZERO)
    label_d = skew(tf.where(edge, log_label, LOG_ZERO), LOG_ZERO)
    alpha0 = tf.concat([tf.zeros([batch, 1]), tf.fill([batch, u1 - 1], LOG_ZERO)], axis=1)

    def step(prev, elems):
        return log_add(prev + elems[0], shift_up(prev + elems[1]))

    alpha = tf.concat([alpha0[None], tf.scan(step, (blank_d[:-1], label_d[:-1]), alpha0)], 0)
    index = tf.stack([logit_lengths - 1 + label_lengths, tf.range(batch), label_lengths], 1)
    return -(tf.gather_nd(alpha, index) + tf.gather_nd(blank_d, index))


def run_one(shape: tuple[int, int, int, int], impl: str, xla: bool, reps: int) -> dict:
    """Runs in the child process: times `reps` forward+backward passes after one warm-up."""
    import numpy as np
    import tensorflow as tf

    from asrkit.losses import rnnt_loss

    batch, frames, max_u, vocab = shape
    rng = np.random.default_rng(0)
    logits = tf.constant(rng.standard_normal((batch, frames, max_u + 1, vocab), np.float32))
    labels = tf.constant(rng.integers(1, vocab, (batch, max_u)), tf.int32)
    logit_lengths = tf.fill([batch], frames)
    label_lengths = tf.fill([batch], max_u)
    loss_fn = rnnt_loss if impl == "asrkit" else _autodiff_baseline

    @tf.function(jit_compile=xla, autograph=False)
    def step(x):
        with tf.GradientTape() as tape:
            tape.watch(x)
            total = tf.reduce_sum(loss_fn(x, labels, logit_lengths, label_lengths))
        return total, tape.gradient(total, x)

    total, grad = step(logits)  # warm-up: tracing and XLA compilation are not measured
    del grad
    times = []

    def timed_passes():
        for _ in range(reps):
            start = time.perf_counter()
            _, grad = step(logits)
            float(grad[0, 0, 0, 0])  # wait for it (grad.numpy() would copy 1x the logits)
            times.append(time.perf_counter() - start)
            del grad

    from asrkit.training.memory_meter import allocator_peak

    extra = allocator_peak(timed_passes)
    logits_bytes = logits.shape.num_elements() * 4
    return {
        "shape": list(shape),
        "impl": impl,
        "xla": xla,
        "median_s": statistics.median(times),
        "extra_peak_gib": extra / 2**30,
        "extra_peak_x_logits": extra / logits_bytes,
        "logits_gib": logits_bytes / 2**30,
        "loss": float(total),
    }


def main() -> None:
    request = child_request()
    if request is not None:
        shape, impl, xla, reps = (request[k] for k in ("shape", "impl", "xla", "reps"))
        reply(run_one(tuple(shape), impl, xla, reps))
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", nargs="+", default=DEFAULT_SHAPES, help="B,T,U,V")
    parser.add_argument("--impls", nargs="+", default=["asrkit", "autodiff"])
    parser.add_argument("--reps", type=int, default=3)
    args = parser.parse_args()
    print(
        f"{'B,T,U,V':>18} {'impl':>9} {'xla':>4} {'median s':>9} {'extra GiB':>10} {'x logits':>9}"
    )
    for text in args.shapes:
        shape = [int(v) for v in text.split(",")]
        for impl in args.impls:
            for xla in (False, True):
                spec = {"shape": shape, "impl": impl, "xla": xla, "reps": args.reps}
                try:
                    r = run_child(__file__, spec)
                except RuntimeError as err:
                    tail = str(err).strip().splitlines()[-1:] or ["(no output)"]
                    print(f"{text:>18} {impl:>9} {xla!s:>4}  failed: {tail[0]}")
                    continue
                print(
                    f"{text:>18} {impl:>9} {xla!s:>4} {r['median_s']:9.3f} "
                    f"{r['extra_peak_gib']:10.2f} {r['extra_peak_x_logits']:9.2f}",
                    flush=True,
                )


if __name__ == "__main__":
    main()
