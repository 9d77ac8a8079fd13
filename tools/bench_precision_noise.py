"""How much a gradient moves when nothing but the batch's layout changes, per precision.

The noise floor behind `asrkit verify-accumulation`'s tolerances: on one micro-batch of an
experiment's training shards (dropout and SpecAugment off), the gradient of the token-mean
loss is computed as is, with 64 extra padding frames (the transducer is padding invariant)
and with its rows permuted. Exact arithmetic gives three identical gradients; the printed
max and norm relative differences are pure rounding.

    python tools/bench_precision_noise.py --exp-dir EXP   (run where EXP's relative paths resolve)
"""

from __future__ import annotations

import argparse
import dataclasses
import os


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--exp-dir", required=True)
    args = parser.parse_args()
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

    import keras
    import numpy as np
    import tensorflow as tf

    from asrkit.config import load_config
    from asrkit.data.pipeline import bucket_plan, make_dataset, pipeline_config
    from asrkit.data.records import shard_lengths
    from asrkit.experiment import resolve_assets
    from asrkit.features import normalizer_for
    from asrkit.models.transducer import Transducer
    from asrkit.tokenizer import Tokenizer
    from asrkit.training.task import TransducerTask

    off = ["model.encoder.dropout=0", "model.predictor.dropout=0"]
    config = resolve_assets(load_config(f"{args.exp_dir}/config.yaml", off), args.exp_dir)
    tokenizer = Tokenizer.load(config.data.tokenizer)
    files, lengths = shard_lengths(config.data.train_shards)
    pipe = dataclasses.replace(pipeline_config(config), spec_augment=None)
    dataset = make_dataset(files, pipe, *bucket_plan(lengths, pipe), training=True,
                           normalize=normalizer_for(config.data.cmvn))  # fmt: skip
    batch = next(iter(dataset))[:4]
    order = tf.random.shuffle(tf.range(tf.shape(batch[0])[0]), seed=1)
    layouts = {
        "64 padding frames": (tf.pad(batch[0], [[0, 0], [0, 64], [0, 0]]), *batch[1:]),
        "rows permuted": tuple(tf.gather(x, order) for x in batch),
    }
    print(f"one micro-batch of {int(tf.shape(batch[0])[0])} utterances; relative to the "
          "gradient as is: max |diff| / max |g|, ||diff|| / ||g||")  # fmt: skip
    for precision in ("float32", "mixed_float16", "mixed_bfloat16"):
        keras.mixed_precision.set_dtype_policy(precision)
        keras.utils.set_random_seed(0)
        model = TransducerTask(Transducer(tokenizer.vocab_size, config.model), config.loss)

        def gradient(data, model=model):
            with tf.GradientTape() as tape:
                loss_sum, count = model.compute_loss_terms(data, training=True)
                loss = loss_sum / tf.cast(count, tf.float32)
            grads = tape.gradient(loss, model.trainable_variables)
            return np.concatenate([tf.convert_to_tensor(g).numpy().ravel() for g in grads])

        reference = gradient(batch).astype(np.float64)
        for name, data in layouts.items():
            diff = gradient(data).astype(np.float64) - reference
            worst = np.abs(diff).max() / np.abs(reference).max()
            norm = np.linalg.norm(diff) / np.linalg.norm(reference)
            print(f"{precision:>15} {name:>18}: max {worst:.2e}  norm {norm:.2e}", flush=True)


if __name__ == "__main__":
    main()
