"""Benchmark the accumulation engine: overhead, memory, and exactness against Keras' own.

Prints four tables:
1. time per micro-batch with N=8 vs N=1 on a frame-wise MLP "encoder" of ~2.6 M parameters;
2. extra peak tensor memory of micro-batch B with N=8, batch B with N=1 and batch 8B with
   N=1 (TensorFlow's allocator peak above what it held once the model, optimizer and
   engine exist and one warm-up epoch ran; a fresh subprocess per run; min of 3 runs);
3. on one device with variable-length micro-batches, the max weight deviation from the
   large-batch reference after one epoch, for asrkit and for Keras' built-in
   `gradient_accumulation_steps` (which averages per-micro-batch means);
4. time per micro-batch under MirroredStrategy over 2 logical CPUs, with and without XLA
   micro-steps (same model and data as table 1, N=8).

    python tools/bench_accumulation.py [--batch 16] [--frames 200] [--micro-batches 32]
                                       [--tables 1,2,3,4]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import child_request, reply, run_child

FEATURES, HIDDEN, LAYERS = 80, 1024, 3


def _encoder_model():
    import keras
    import tensorflow as tf

    from asrkit.training import AccumulatingModel

    class FrameEncoder(AccumulatingModel):
        def __init__(self):
            super().__init__()
            self.blocks = [keras.layers.Dense(HIDDEN, activation="relu") for _ in range(LAYERS)]
            self.head = keras.layers.Dense(FEATURES)

        def compute_loss_terms(self, data, training=True):
            x, lengths = data
            h = x
            for block in self.blocks:
                h = block(h)
            err = tf.reduce_sum(tf.square(self.head(h) - x), axis=-1)  # [B, T]
            mask = tf.sequence_mask(lengths, tf.shape(x)[1], dtype=err.dtype)
            return tf.reduce_sum(err * mask), tf.reduce_sum(mask)

    return FrameEncoder()


def _frames_dataset(count: int, batch: int, frames: int, seed: int = 0):
    import numpy as np
    import tensorflow as tf

    rng = np.random.default_rng(seed)
    x = rng.standard_normal((count, batch, frames, FEATURES)).astype(np.float32)
    lengths = rng.integers(frames // 2, frames + 1, size=(count, batch)).astype(np.int32)
    return tf.data.Dataset.from_tensor_slices((x, lengths))


def run_config(
    batch: int,
    steps: int,
    frames: int,
    micro_batches: int,
    measure: str,
    mirrored: bool = False,
    jit_compile: bool = False,
) -> dict:
    import contextlib

    import keras
    import tensorflow as tf

    scope = contextlib.nullcontext()
    if mirrored:
        cpu = tf.config.list_physical_devices("CPU")[0]
        tf.config.set_logical_device_configuration(
            cpu, [tf.config.LogicalDeviceConfiguration()] * 2
        )
        devices = [d.name for d in tf.config.list_logical_devices("CPU")]
        scope = tf.distribute.MirroredStrategy(devices).scope()
    keras.utils.set_random_seed(0)
    data = _frames_dataset(micro_batches, batch, frames)
    with scope:
        model = _encoder_model()
        model.compile(
            keras.optimizers.AdamW(1e-4), accumulation_steps=steps, jit_compile=jit_compile
        )
        model.build_engine(next(iter(data)))
    params = sum(int(v.shape.num_elements()) for v in model.trainable_variables)
    model.fit(data.take(steps * 2), verbose=0)  # warm-up: tracing
    if measure == "memory":
        from asrkit.training.memory_meter import allocator_peak

        extra = allocator_peak(lambda: model.fit(data, verbose=0))
        return {"params": params, "extra_mib": extra / 2**20}
    times = []
    for _ in range(3):
        start = time.perf_counter()
        model.fit(data, verbose=0)
        times.append((time.perf_counter() - start) / micro_batches)
    return {"params": params, "s_per_micro_batch": statistics.median(times)}


def exactness(steps: int = 4, seed: int = 0) -> dict:
    """Max |w - w_ref| after one epoch of variable-size micro-batches, asrkit vs Keras."""
    import keras
    import numpy as np
    import tensorflow as tf

    from asrkit.training import AccumulatingModel

    rng = np.random.default_rng(seed)
    sizes = rng.integers(1, 33, size=steps * 4)
    batches = [
        (rng.standard_normal((n, 16)).astype(np.float32), rng.standard_normal((n, 1)))
        for n in sizes
    ]

    def layers():
        keras.utils.set_random_seed(3)
        return [keras.layers.Dense(32, activation="tanh"), keras.layers.Dense(1)]

    class Mlp(AccumulatingModel):
        def __init__(self):
            super().__init__()
            self.stack = layers()

        def call(self, x):
            for layer in self.stack:
                x = layer(x)
            return x

        def compute_loss_terms(self, data, training=True):
            x, y = data
            return tf.reduce_sum(tf.square(self(x) - tf.cast(y, tf.float32))), tf.shape(x)[0]

    def dataset():
        parts = [tf.data.Dataset.from_tensor_slices(b).batch(len(b[0])) for b in batches]
        out = parts[0]
        for part in parts[1:]:
            out = out.concatenate(part)
        return out

    ours = Mlp()
    ours.compile(keras.optimizers.SGD(0.1), accumulation_steps=steps)
    ours.build_engine(batches[0])
    initial = [v.numpy() for v in ours.trainable_variables]
    ours.fit(dataset(), verbose=0)

    theirs = keras.Sequential([keras.Input((16,)), *layers()])
    for var, value in zip(theirs.trainable_variables, initial, strict=True):
        var.assign(value)
    theirs.compile(keras.optimizers.SGD(0.1, gradient_accumulation_steps=steps), loss="mse")
    theirs.fit(dataset(), verbose=0)

    reference = Mlp()
    reference(batches[0][0])
    for var, value in zip(reference.trainable_variables, initial, strict=True):
        var.assign(value)
    optimizer = keras.optimizers.SGD(0.1)
    for k in range(0, len(batches), steps):
        x = np.concatenate([b[0] for b in batches[k : k + steps]])
        y = np.concatenate([b[1] for b in batches[k : k + steps]])
        with tf.GradientTape() as tape:
            loss_sum, count = reference.compute_loss_terms((x, y))
            loss = loss_sum / tf.cast(count, tf.float32)
        optimizer.apply(
            tape.gradient(loss, reference.trainable_variables), reference.trainable_variables
        )
    ref = [v.numpy() for v in reference.trainable_variables]

    def deviation(model):
        return max(
            float(np.max(np.abs(v.numpy() - r)))
            for v, r in zip(model.trainable_variables, ref, strict=True)
        )

    update = max(float(np.max(np.abs(r - i))) for r, i in zip(ref, initial, strict=True))
    return {"asrkit": deviation(ours), "keras": deviation(theirs), "update": update}


def _child(spec: dict) -> dict:
    return run_child(__file__, spec)


def main() -> None:
    request = child_request()
    if request is not None:
        kind = request["kind"]
        reply(exactness() if kind == "exactness" else run_config(**request["config"]))
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=16, help="micro-batch size B")
    parser.add_argument("--frames", type=int, default=200)
    parser.add_argument("--micro-batches", type=int, default=32)
    parser.add_argument("--tables", default="1,2,3,4", help="which tables to print")
    args = parser.parse_args()
    tables = {int(t) for t in args.tables.split(",")}

    b, n, t, m = args.batch, 8, args.frames, args.micro_batches
    if 1 in tables:
        _timing_table(b, n, t, m)
    if 2 in tables:
        _memory_table(b, n, t, m)
    if 3 in tables:
        _exactness_table()
    if 4 in tables:
        _mirrored_table(b, n, t, m)


def _timing_table(b, n, t, m):
    print(f"1. time per micro-batch (B={b}, T={t}, {m} micro-batches, median of 3 epochs)")
    timing = {}
    for steps in (1, n):
        config = dict(batch=b, steps=steps, frames=t, micro_batches=m, measure="time")
        timing[steps] = _child({"kind": "run", "config": config})
        print(f"   N={steps}: {timing[steps]['s_per_micro_batch'] * 1e3:8.2f} ms", flush=True)
    overhead = timing[n]["s_per_micro_batch"] / timing[1]["s_per_micro_batch"] - 1
    print(f"   params {timing[1]['params']:,}; overhead of N={n}: {overhead * 100:+.1f} %")


def _memory_table(b, n, t, m):
    print("2. extra peak tensor memory (allocator, min of 3 runs)")
    memory = {}
    for label, batch, steps, count in (
        (f"B={b}, N={n}", b, n, m),
        (f"B={b}, N=1", b, 1, m),
        (f"B={b * n}, N=1", b * n, 1, m // n),
    ):
        config = dict(batch=batch, steps=steps, frames=t, micro_batches=count, measure="memory")
        # Allocator noise only ever adds to a peak: the minimum of 3 fresh runs is the estimate.
        runs = [_child({"kind": "run", "config": config}) for _ in range(3)]
        memory[label] = min(runs, key=lambda r: r["extra_mib"])
        spread = ", ".join(f"{r['extra_mib']:.0f}" for r in runs)
        print(
            f"   {label:>12}: {memory[label]['extra_mib']:8.1f} MiB  (runs: {spread})", flush=True
        )
    ratio = memory[f"B={b}, N={n}"]["extra_mib"] / memory[f"B={b}, N=1"]["extra_mib"]
    print(f"   B with N={n} vs B with N=1: {ratio:.2f}x")


def _exactness_table():
    print("3. max |w - w_ref| after one epoch of variable-size micro-batches (SGD, N=4)")
    result = _child({"kind": "exactness"})
    print(
        f"   asrkit: {result['asrkit']:.2e}   keras gradient_accumulation_steps: "
        f"{result['keras']:.2e}   (largest weight change {result['update']:.2e})"
    )


def _mirrored_table(b, n, t, m):
    print(f"4. MirroredStrategy, 2 logical CPUs: time per micro-batch (B={b} global, N={n})")
    mirrored = {}
    for jit in (False, True):
        config = dict(batch=b, steps=n, frames=t, micro_batches=m, measure="time",
                      mirrored=True, jit_compile=jit)  # fmt: skip
        mirrored[jit] = _child({"kind": "run", "config": config})["s_per_micro_batch"]
        print(f"   jit_compile={jit!s:5}: {mirrored[jit] * 1e3:8.2f} ms", flush=True)
    print(f"   XLA vs plain: {mirrored[True] / mirrored[False]:.2f}x")


if __name__ == "__main__":
    main()
