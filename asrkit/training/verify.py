"""`verify_accumulation`: on the user's own model and data, one update made from N
micro-batches must equal one update made from their union as one batch.

Dropout and SpecAugment are switched off for the check (they draw different random numbers
for a micro-batch than for the same rows inside a larger batch), and both updates use SGD
with learning rate 1, so the weight change *is* the (clipped) window gradient: Adam's first
step, lr · g / |g|, would turn float rounding in near-zero gradient entries into full ±lr
differences and hide what is being checked. The union batch is the N
micro-batches padded to a common length and concatenated; the transducer is padding
invariant, so the union's loss is exactly the micro-batches' losses summed.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import keras
import numpy as np
import tensorflow as tf

from asrkit.config import ExperimentConfig
from asrkit.data.pipeline import bucket_plan, make_dataset
from asrkit.data.records import shard_lengths
from asrkit.decoding.runner import normalizer_for
from asrkit.tokenizer import Tokenizer


@dataclass(frozen=True)
class VerifyReport:
    steps: int
    micro_batch_sizes: list[int]
    max_relative_difference: float  # max |Δw_accumulated - Δw_union| / max |Δw_union|
    tolerance: float

    @property
    def passed(self) -> bool:
        return self.max_relative_difference <= self.tolerance


def verify_accumulation(
    config: ExperimentConfig, steps: int = 4, tolerance: float | None = None
) -> VerifyReport:
    from asrkit.training.trainer import build_model, pipeline_config

    config = _deterministic(config)
    precision = config.train.precision
    if tolerance is None:
        tolerance = 1e-4 if precision == "float32" else 2e-2
    keras.mixed_precision.set_dtype_policy(precision)
    tokenizer = Tokenizer.load(config.data.tokenizer)
    files, lengths = shard_lengths(config.data.train_shards)
    pipe = dataclasses.replace(pipeline_config(config), spec_augment=None)
    dataset = make_dataset(
        files, pipe, *bucket_plan(lengths, pipe), training=True, seed=config.train.seed,
        normalize=normalizer_for(config),
    )  # fmt: skip
    micro = [tuple(t.numpy() for t in batch) for batch in dataset.take(steps)]
    if len(micro) < steps:
        raise ValueError(f"verify-accumulation: only {len(micro)} micro-batches available")

    keras.utils.set_random_seed(config.train.seed)
    accumulated = build_model(config, tokenizer.vocab_size, steps, keras.optimizers.SGD(1.0))
    accumulated.build_engine(micro[0])
    initial = [v.numpy() for v in accumulated.trainable_variables]
    union_model = build_model(config, tokenizer.vocab_size, 1, keras.optimizers.SGD(1.0))
    union_model.build_engine(micro[0])
    for var, value in zip(union_model.trainable_variables, initial, strict=True):
        var.assign(value)

    accumulated.fit(_as_dataset(micro), verbose=0)
    union_model.fit(_as_dataset([_union(micro)]), verbose=0)
    moved = max(
        float(np.max(np.abs(v.numpy() - w0)))
        for v, w0 in zip(union_model.trainable_variables, initial, strict=True)
    )
    diff = max(
        float(np.max(np.abs(a.numpy() - b.numpy())))
        for a, b in zip(
            accumulated.trainable_variables, union_model.trainable_variables, strict=True
        )
    )
    return VerifyReport(steps, [len(m[1]) for m in micro], diff / max(moved, 1e-30), tolerance)


def _deterministic(config: ExperimentConfig) -> ExperimentConfig:
    model = config.model
    model = dataclasses.replace(
        model,
        encoder=dataclasses.replace(model.encoder, dropout=0.0),
        predictor=dataclasses.replace(model.predictor, dropout=0.0),
    )
    data = dataclasses.replace(config.data, spec_augment=False)
    return dataclasses.replace(config, model=model, data=data)


def _union(micro: list[tuple]) -> tuple:
    frames = max(m[0].shape[1] for m in micro)
    labels = max(m[2].shape[1] for m in micro)
    features = np.concatenate(
        [np.pad(m[0], [(0, 0), (0, frames - m[0].shape[1]), (0, 0)]) for m in micro]
    )
    padded_labels = np.concatenate(
        [np.pad(m[2], [(0, 0), (0, labels - m[2].shape[1])]) for m in micro]
    )
    return (
        features,
        np.concatenate([m[1] for m in micro]),
        padded_labels,
        np.concatenate([m[3] for m in micro]),
    )


def _as_dataset(batches: list[tuple]) -> tf.data.Dataset:
    def gen():
        yield from batches

    def shape(array):  # batch and time vary; the feature axis stays known
        return [None] * min(array.ndim, 2) + list(array.shape[2:])

    spec = tuple(tf.TensorSpec(shape(b), tf.as_dtype(b.dtype)) for b in batches[0])
    return tf.data.Dataset.from_generator(gen, output_signature=spec)
