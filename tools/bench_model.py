"""Parameters and training step time of the transducer configurations.

Builds each model (Conformer-S and Conformer-M shapes, and the mini recipe's LSTM), then times
forward + backward + update of one micro-batch (median of 3 after a warm-up) through the
accumulation engine, float32, on whatever device TensorFlow picks.

    python tools/bench_model.py [--batch 4] [--seconds 10] [--labels 40]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--labels", type=int, default=40)
    args = parser.parse_args()
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

    import keras
    import numpy as np
    import tensorflow as tf

    from asrkit.config import EncoderConfig, ModelConfig, PredictorConfig
    from asrkit.models.transducer import Transducer

    models = {
        "conformer_s": (ModelConfig(
            EncoderConfig(d_model=144, num_blocks=16, num_heads=4, kernel_size=31,
                          subsampling_filters=144),
            PredictorConfig(embed_dim=320, units=320), joint_dim=320), 1024),
        "conformer_m": (ModelConfig(
            EncoderConfig(d_model=256, num_blocks=16, num_heads=4, kernel_size=31,
                          subsampling_filters=256),
            PredictorConfig(embed_dim=640, units=640), joint_dim=640), 1024),
        "mini_lstm": (ModelConfig(
            EncoderConfig(kind="lstm", lstm_units=256, lstm_layers=2, subsampling_filters=32),
            PredictorConfig(embed_dim=64, units=256), joint_dim=256), 64),
    }  # fmt: skip
    frames = int(args.seconds * 100)
    for name, (config, vocab) in models.items():
        rng = np.random.default_rng(0)
        batch = (
            rng.standard_normal((args.batch, frames, 80)).astype(np.float32),
            np.full(args.batch, frames, np.int32),
            rng.integers(1, vocab, (args.batch, args.labels)).astype(np.int32),
            np.full(args.batch, args.labels, np.int32),
        )
        model = Transducer(vocab, config)
        model.compile(keras.optimizers.AdamW(1e-4), accumulation_steps=1)
        model.build_engine(batch)
        params = sum(int(np.prod(v.shape)) for v in model.trainable_variables)
        data = tf.data.Dataset.from_tensors(batch)
        model.fit(data, verbose=0)  # warm-up: tracing
        times = []
        for _ in range(3):
            start = time.perf_counter()
            model.fit(data, verbose=0)
            times.append(time.perf_counter() - start)
        print(
            f"{name:12s} {params / 1e6:6.2f} M parameters, {statistics.median(times):6.2f} s per "
            f"micro-batch of {args.batch} x {args.seconds:.0f} s (U={args.labels}, V={vocab})",
            flush=True,
        )


if __name__ == "__main__":
    main()
