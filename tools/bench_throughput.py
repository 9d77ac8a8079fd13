"""How close a training step comes to what this machine's cores can do.

The peak of dense matrix products is measured with a plain square `tf.matmul` (`--gemm`,
4096 by default) in float32 and bfloat16, median of `--repeats`, once before the model
figures and once after them; the shares are of the faster of the two (on a shared machine
the same GEMM has run 1.5x slower for minutes at a time, which would flatter the share).
Then, for each config,
the achieved FLOP/s of
- the encoder's forward + backward (the gradient of a sum of its output with respect to
  every trainable weight and the features), and
- the whole training step (forward, loss, backward and asrkit's AdamW update; the update's
  FLOPs are not counted, it is a few operations per weight),
on one micro-batch of `--batch` x `--seconds` with `--labels` labels, in float32 and mixed
bfloat16, with and without XLA (`--jit`). FLOPs are counted as the ops run, not by hand:
every matrix product, einsum and convolution (forward and gradient kernels alike) is 2 x
its multiply-adds, taken from the shapes of its operands (`executed_flops`, one eager run,
loops counted per iteration); elementwise work is not counted, so the share of the peak is
the share spent on products.

    python tools/bench_throughput.py [--configs fastconformer_rnnt_114m,parakeet_tdt_0.6b] \
        [--batch 2] [--seconds 10] [--labels 40] [--repeats 3] [--jit]

Each figure is the median (min-max) of `--repeats` timed calls after a warm-up (the whole
step: `--repeats` updates of one `fit` epoch after an untimed one, harness.update_times; then
`--repeats` whole `fit` calls of one update each, so that what a call costs beyond its update
shows; `--autotuned-data` feeds `fit` a dataset with tf.data's autotuning on, as a dataset
has it by default), all in one process on whatever the cores are doing: run it on an idle
machine.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import timed, update_times

CONFIGS = {
    "fastconformer_rnnt_114m": "finetune/conf/fastconformer_rnnt_114m.yaml",
    "parakeet_tdt_0.6b": "finetune/conf/parakeet_tdt_0.6b.yaml",
    "mini_conformer": "mini/conf/conformer_cpu.yaml",
}
VOCAB = {"mini_conformer": 64}  # the others: 1024 pieces, as published


def _size(shape) -> int:
    product = 1
    for dim in shape:
        product *= int(dim)
    return product


def _einsum_flops(inputs, outputs, attrs) -> int:
    equation = attrs["equation"]
    equation = equation.decode() if isinstance(equation, bytes) else equation
    operands = equation.split("->")[0].split(",")
    sizes = {}
    for letters, shape in zip(operands, inputs, strict=True):
        if "." in letters:
            raise ValueError(f"executed_flops: an einsum with an ellipsis ({equation})")
        sizes.update(zip(letters, shape, strict=True))
    return 2 * _size(sizes.values())


def _matmul_flops(inputs, outputs, attrs) -> int:
    a = inputs[0]
    transposed = attrs.get("transpose_a", attrs.get("adj_x", False))
    return 2 * _size(outputs[0]) * (a[-2] if transposed else a[-1])


def _conv_flops(kind):
    """A forward convolution and both its gradient kernels cost 2 x (the forward's output
    elements) x (the filter's taps, times the input channels unless depthwise)."""

    def flops(inputs, outputs, attrs) -> int:
        if kind == "forward":  # (input, filter) -> output
            out, filt = outputs[0], inputs[1]
        elif kind == "input":  # (input_sizes, filter, out_backprop) -> d input
            out, filt = inputs[2], inputs[1]
        else:  # (input, filter_sizes, out_backprop) -> d filter
            out, filt = inputs[2], outputs[0]
        depthwise = attrs["depthwise"]
        return 2 * _size(out) * filt[0] * filt[1] * (1 if depthwise else filt[2])

    return flops


COUNTED = {
    "MatMul": _matmul_flops, "BatchMatMulV2": _matmul_flops, "BatchMatMulV3": _matmul_flops,
    "Einsum": _einsum_flops, "Conv2D": _conv_flops("forward"),
    "Conv2DBackpropInput": _conv_flops("input"), "Conv2DBackpropFilter": _conv_flops("filter"),
    "DepthwiseConv2dNative": _conv_flops("forward"),
    "DepthwiseConv2dNativeBackpropInput": _conv_flops("input"),
    "DepthwiseConv2dNativeBackpropFilter": _conv_flops("filter"),
}  # fmt: skip


def executed_flops(fn, *args) -> int:
    """FLOPs of the matrix products and convolutions one call of `fn` executes (2 x their
    multiply-adds, forward and gradient kernels alike), counted from the operands' shapes
    as each op runs: `fn` runs once eagerly (tf.functions too), so loops count every
    iteration and nothing that does not run is counted."""
    import tensorflow as tf
    from tensorflow.python.framework import op_callbacks

    total = 0

    def count(op_type, inputs, attrs, outputs, op_name=None, graph=None):
        nonlocal total
        if graph is None and op_type in COUNTED:
            settings = dict(zip(attrs[::2], attrs[1::2], strict=True)) if attrs else {}
            settings["depthwise"] = op_type.startswith("Depthwise")
            total += COUNTED[op_type](
                [tuple(t.shape) for t in inputs], [tuple(t.shape) for t in outputs], settings
            )

    eager = tf.config.functions_run_eagerly()
    tf.config.run_functions_eagerly(True)
    op_callbacks.add_op_callback(count)
    try:
        fn(*args)
    finally:
        op_callbacks.remove_op_callback(count)
        tf.config.run_functions_eagerly(eager)
    return total


def _gemm_peak(size: int, dtype: str, repeats: int):
    import tensorflow as tf

    a = tf.random.normal([size, size], dtype=tf.float32)
    a, b = tf.cast(a, dtype), tf.cast(tf.transpose(a), dtype)
    product = tf.function(
        lambda: tf.reduce_sum(tf.cast(tf.matmul(a, b)[:1, :1], tf.float32)), autograph=False
    )
    spent = timed(lambda: float(product()), repeats=repeats)
    return spent, 2 * size**3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--configs", default="fastconformer_rnnt_114m,parakeet_tdt_0.6b")
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--labels", type=int, default=40)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--gemm", type=int, default=4096)
    parser.add_argument(
        "--precisions",
        default="float32,mixed_bfloat16",
        help="comma-separated; one per process at 0.6 B (both exceed 24 GiB)",
    )
    parser.add_argument("--jit", action="store_true", help="also time the step under XLA")
    parser.add_argument(
        "--autotuned-data",
        action="store_true",
        help="feed fit a dataset with tf.data's autotuning on (its default; asrkit's "
        "pipelines turn it off): shows its wait at a fit call's end",
    )
    args = parser.parse_args()
    chosen = args.configs.split(",")
    unknown = sorted(set(chosen) - set(CONFIGS))
    if unknown:
        parser.error(f"--configs: unknown {unknown} (known: {', '.join(CONFIGS)})")
    odd = sorted(set(args.precisions.split(",")) - {"float32", "mixed_bfloat16"})
    if odd:
        parser.error(f"--precisions: unknown {odd} (known: float32, mixed_bfloat16)")
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

    peaks = _peaks(args, "before", {})
    measured = [
        _measure(name, precision, jit, args)
        for name in chosen
        for precision in args.precisions.split(",")
        for jit in ((False, True) if args.jit else (False,))
    ]
    peaks = _peaks(args, "after", peaks)
    print(f"shares of the faster peak: float32 {peaks['float32']:.0f} GFLOP/s, "
          f"bfloat16 {peaks['bfloat16']:.0f} GFLOP/s")  # fmt: skip
    for label, precision, achieved in (row for rows in measured for row in rows):
        peak = peaks["bfloat16" if "bfloat16" in precision else "float32"]
        print(f"{label}: {achieved:.0f} GFLOP/s = "
              f"{100 * achieved / peaks['float32']:.0f} % of the float32 peak"
              + (f", {100 * achieved / peak:.0f} % of the bfloat16 peak"
                 if peak != peaks["float32"] else ""), flush=True)  # fmt: skip


def _peaks(args, when: str, before: dict) -> dict:
    """The GEMM peak per dtype, printed; with `before`, the faster of the two runs."""
    peaks = {}
    for dtype in ("float32", "bfloat16"):
        spent, flops = _gemm_peak(args.gemm, dtype, args.repeats)
        rate = flops / spent.median / 1e9
        peaks[dtype] = max(rate, before.get(dtype, 0.0))
        print(f"peak  {dtype:9s} {args.gemm}^3 matmul, {when}: {spent.format('.3f')} s "
              f"-> {rate:.0f} GFLOP/s", flush=True)  # fmt: skip
    return peaks


def _measure(name, precision, jit, args) -> list[tuple[str, str, float]]:
    """Prints each figure as it is measured; returns (label, precision, GFLOP/s) per figure."""
    import keras
    import numpy as np
    import tensorflow as tf

    from asrkit.config import load_config
    from asrkit.data.pipeline import without_autotuning
    from asrkit.models.transducer import Transducer
    from asrkit.training.optimizers import build_optimizer
    from asrkit.training.task import TransducerTask

    recipes = Path(__file__).resolve().parents[1] / "recipes"
    config = load_config(recipes / CONFIGS[name])
    keras.mixed_precision.set_global_policy(precision)
    mels = config.features.num_mel_bins
    vocab = VOCAB.get(name, 1024)
    frames = int(args.seconds * 100)
    rng = np.random.default_rng(0)
    batch = (
        tf.constant(rng.standard_normal((args.batch, frames, mels)).astype(np.float32)),
        tf.constant(np.full(args.batch, frames, np.int32)),
        tf.constant(rng.integers(1, vocab, (args.batch, args.labels)).astype(np.int32)),
        tf.constant(np.full(args.batch, args.labels, np.int32)),
    )
    task = TransducerTask(Transducer(vocab, config.model), loss=config.loss)
    task.compile(build_optimizer("adamw", 1e-4, 0.01), accumulation_steps=1, jit_compile=jit)
    task.build_engine(batch)
    encoder_weights = task.network.encoder.trainable_variables

    def encoder_pass(features, lengths):
        with tf.GradientTape() as tape:
            tape.watch(features)
            encoded, _ = task.network.encode(features, lengths, training=True)
            total = tf.reduce_sum(tf.cast(encoded, tf.float32))
        return tape.gradient(total, [features, *encoder_weights])

    def step_pass(data):
        with tf.GradientTape() as tape:
            loss_sum, _ = task.compute_loss_terms(data, training=True)
        return tape.gradient(loss_sum, task.trainable_variables)

    encoder_fn = tf.function(encoder_pass, jit_compile=jit, autograph=False)
    encoder_flops = executed_flops(encoder_pass, *batch[:2])
    step_flops = executed_flops(step_pass, batch)
    dataset = tf.data.Dataset.from_tensors(batch)
    dataset = dataset if args.autotuned_data else without_autotuning(dataset)
    figures = [
        ("encoder fwd+bwd", encoder_flops,
         timed(lambda: [t.numpy() for t in encoder_fn(*batch[:2])[:1]], repeats=args.repeats)),
        ("whole step (one update of a fit epoch)", step_flops,
         update_times(task, dataset, args.repeats)),
        ("a whole fit call of one update (its set-up and the epoch's end too)", step_flops,
         timed(lambda: task.fit(dataset, verbose=0), repeats=args.repeats, warmup=0)),
    ]  # fmt: skip
    rows = []
    for what, flops, spent in figures:
        label = f"{name} {precision}{' XLA' if jit else ''} {what}"
        achieved = flops / spent.median / 1e9
        print(f"{label}: {flops / 1e9:.0f} GFLOP in {spent.format('.3f')} s "
              f"({achieved:.0f} GFLOP/s)", flush=True)  # fmt: skip
        rows.append((label, precision, achieved))
    keras.mixed_precision.set_global_policy("float32")
    return rows


if __name__ == "__main__":
    main()
