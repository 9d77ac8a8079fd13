"""Parameters and training step time of the transducer configurations.

Builds each recipe's model (recipes/librispeech/conf/conformer_{s,m}.yaml with the recipe's
1024-piece vocabulary, the mini recipe's Conformer and LSTM with 64 pieces), then times
forward + backward + update of one micro-batch (median and range of `--repeats` after a
warm-up) through the accumulation engine, float32, on whatever device TensorFlow picks.

    python tools/bench_model.py [--batch 4] [--seconds 10] [--labels 40] [--models mini_lstm]
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import timed

# name -> (recipe config, vocabulary size)
MODELS = {
    "conformer_s": ("librispeech/conf/conformer_s.yaml", 1024),
    "conformer_m": ("librispeech/conf/conformer_m.yaml", 1024),
    "mini_conformer": ("mini/conf/conformer_cpu.yaml", 64),
    "mini_lstm": ("mini/conf/lstm_cpu.yaml", 64),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--labels", type=int, default=40)
    parser.add_argument("--repeats", type=int, default=3, help="timed steps after a warm-up")
    parser.add_argument("--models", default=",".join(MODELS), help="which of " + ",".join(MODELS))
    args = parser.parse_args()
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

    import keras
    import numpy as np
    import tensorflow as tf

    from asrkit.config import load_config
    from asrkit.data.pipeline import without_autotuning
    from asrkit.models.transducer import Transducer
    from asrkit.training.task import TransducerTask

    recipes = Path(__file__).resolve().parents[1] / "recipes"
    chosen = args.models.split(",")
    unknown = sorted(set(chosen) - set(MODELS))
    if unknown:
        parser.error(f"--models: unknown {unknown} (known: {', '.join(MODELS)})")
    models = {n: (load_config(recipes / MODELS[n][0]).model, MODELS[n][1]) for n in chosen}
    frames = int(args.seconds * 100)
    for name, (config, vocab) in models.items():
        rng = np.random.default_rng(0)
        batch = (
            rng.standard_normal((args.batch, frames, 80)).astype(np.float32),
            np.full(args.batch, frames, np.int32),
            rng.integers(1, vocab, (args.batch, args.labels)).astype(np.int32),
            np.full(args.batch, args.labels, np.int32),
        )
        model = TransducerTask(Transducer(vocab, config))
        model.compile(keras.optimizers.AdamW(1e-4), accumulation_steps=1)
        model.build_engine(batch)
        params = sum(int(np.prod(v.shape)) for v in model.trainable_variables)
        data = without_autotuning(tf.data.Dataset.from_tensors(batch))
        step = timed(lambda: model.fit(data, verbose=0), repeats=args.repeats)  # noqa: B023
        print(
            f"{name:12s} {params / 1e6:6.2f} M parameters, {step.format('.3f')} s per "
            f"micro-batch of {args.batch} x {args.seconds:g} s (U={args.labels}, V={vocab})",
            flush=True,
        )


if __name__ == "__main__":
    main()
