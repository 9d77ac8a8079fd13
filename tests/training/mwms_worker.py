"""One worker of the MultiWorkerMirroredStrategy test (run as a subprocess with TF_CONFIG)."""

import json
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras
import numpy as np
import tensorflow as tf

from tests.training.toy import TokenRegressor, make_batches, make_dataset, weights


def main(out_path: str, sizes: list[int], steps: int, jit_compile: bool = False) -> None:
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    batches = make_batches(sizes)
    with strategy.scope():
        keras.utils.set_random_seed(1)
        model = TokenRegressor()
        model.compile(
            keras.optimizers.AdamW(0.05, weight_decay=0.1),
            accumulation_steps=steps,
            jit_compile=jit_compile,
        )
        model.build_engine(batches[0])
    initial = weights(model)
    model.fit(make_dataset(batches), epochs=1, verbose=0)
    np.savez(
        out_path,
        iterations=int(model.optimizer.iterations.numpy()),
        **{f"initial_{i}": w for i, w in enumerate(initial)},
        **{f"final_{i}": w for i, w in enumerate(weights(model))},
    )


if __name__ == "__main__":
    index = json.loads(os.environ["TF_CONFIG"])["task"]["index"]  # {index} in the path
    main(sys.argv[1].format(index=index), [int(v) for v in sys.argv[2].split(",")],
         int(sys.argv[3]), sys.argv[4:] == ["jit"])  # fmt: skip
