"""`verify_accumulation`: on the user's own model and data, one update made from N
micro-batches must equal one update made from their union as one batch.

Dropout and SpecAugment are switched off for the check (they draw different random numbers
for a micro-batch than for the same rows inside a larger batch), and both updates use SGD
with learning rate 1, so the weight change *is* the (clipped) window gradient: Adam's first
step, lr · g / |g|, would turn float rounding in near-zero gradient entries into full ±lr
differences and hide what is being checked. The union batch is the N
micro-batches padded to a common length and concatenated; the transducer is padding
invariant, so the union's loss is exactly the micro-batches' losses summed.

In reduced precision the two updates differ by rounding as well, and how much grows with the
model. With `floor`, the check measures what the precision itself moves on the same batch:
the union's update in float32 against the union's in the reduced precision. The default
tolerance is then the larger of a fixed one and twice the floor (two reduced-precision
updates may each be the floor away from the float32 one, in different directions). The
floor needs a float32 network beside the two checked ones (their memory is not all given
back): about 1.4x the check's memory (at 0.6 B more than 24 GB).
"""

from __future__ import annotations

import dataclasses
import gc
from dataclasses import dataclass

import keras
import numpy as np
import tensorflow as tf

from asrkit.checkpoints import named_parts
from asrkit.config import ExperimentConfig
from asrkit.data.batch_plan import micro_batch_plan
from asrkit.data.pipeline import make_dataset, pipeline_config
from asrkit.data.records import on_the_fly, shard_counts
from asrkit.errors import InputError
from asrkit.features import normalizer_for
from asrkit.tokenizer import Tokenizer
from asrkit.training.setup import build_task, process_settings


@dataclass(frozen=True)
class VerifyReport:
    steps: int
    micro_batch_sizes: list[int]
    max_relative_difference: float  # max |Δw_accumulated - Δw_union| / max |Δw_union|
    norm_relative_difference: float  # ‖Δw_accumulated - Δw_union‖ / ‖Δw_union‖
    tolerance: float  # on the max relative difference
    attempts: int  # windows tried until both updates were applied (float16 overflow skips)
    # with `floor` in reduced precision: the same two differences between the union's update
    # in float32 and in the reduced precision (what the precision alone moves); else None
    floor_max: float | None = None
    floor_norm: float | None = None

    @property
    def passed(self) -> bool:
        return self.max_relative_difference <= self.tolerance


def verify_accumulation(
    config: ExperimentConfig, steps: int = 4, tolerance: float | None = None, floor: bool = False
) -> VerifyReport:
    files, frames, tokens = shard_counts(config.data.train_shards)
    plan = micro_batch_plan(config, frames, tokens)  # checked against the config as trained
    with process_settings(_deterministic(config)):
        return _verify(_deterministic(config), files, plan, steps, tolerance, floor)


def _verify(
    config: ExperimentConfig,
    files: list[str],
    plan,
    steps: int,
    tolerance: float | None,
    floor_wanted: bool = False,
) -> VerifyReport:
    precision = config.train.precision
    # bfloat16 keeps 8 mantissa bits: merely permuting the rows of one mini-model batch
    # moves its gradient by 10 % (max) / 1.7 % (norm) (RESULTS.md), so in reduced precision
    # the check can only catch gross errors (a doubled, dropped or mis-normalised window).
    fixed = {"float32": 1e-4, "mixed_float16": 2e-2}.get(precision, 0.25)
    tokenizer = Tokenizer.load(config.data.tokenizer)
    pipe = dataclasses.replace(pipeline_config(config), spec_augment=None)
    dataset = make_dataset(
        files, pipe, *plan, training=True, seed=config.train.seed,
        num_mel_bins=config.features.num_mel_bins, normalize=normalizer_for(config.data.cmvn),
        audio=on_the_fly(config.data.train_shards, config.features),
    )  # fmt: skip
    micro = [tuple(t.numpy() for t in batch) for batch in dataset.take(steps)]
    if len(micro) < steps:
        raise InputError(
            f"verify-accumulation: the training shards make only {len(micro)} micro-batches; "
            "lower --steps or data.batch_seconds"
        )

    accumulated = build_task(config, tokenizer.vocab_size, steps, keras.optimizers.SGD(1.0))
    accumulated.build_engine(micro[0])
    union_model = build_task(config, tokenizer.vocab_size, 1, keras.optimizers.SGD(1.0))
    union_model.build_engine(micro[0])
    # every weight, trained or frozen (a frozen encoder, a LoRA base), the same in both
    sources = named_parts(accumulated.network, accumulated.heads)
    for name, var in named_parts(union_model.network, union_model.heads).items():
        var.assign(sources[name])
    # One copy of the initial weights on the host (and for the floor one of the union's
    # updated ones); the differences are taken variable by variable.
    initial = [v.numpy() for v in accumulated.trainable_variables]
    measure_floor = floor_wanted and precision != "float32"  # then the union's weights kept
    start = {k: v.numpy() for k, v in sources.items()} if measure_floor else None
    union = _union(micro)
    attempts = _update(accumulated, micro, 0)
    attempts = _update(union_model, [union], attempts)
    union_weights = [v.numpy() for v in union_model.trainable_variables] if measure_floor else None
    reference = union_weights or (v.numpy() for v in union_model.trainable_variables)
    difference = _difference(accumulated.trainable_variables, reference, initial)
    floor = (None, None)
    if measure_floor:  # the floor: the union's update in float32, against the reduced precision's
        # The two reduced-precision networks are let go first (their traced functions hold
        # them in reference cycles); TensorFlow gives back only part of their memory.
        del accumulated, union_model, sources
        gc.collect()
        exact_config = dataclasses.replace(
            config, train=dataclasses.replace(config.train, precision="float32")
        )
        with process_settings(exact_config):  # a float32 network; the policy restored after
            exact = build_task(exact_config, tokenizer.vocab_size, 1, keras.optimizers.SGD(1.0))
            exact.build_engine(micro[0])
        for name, var in named_parts(exact.network, exact.heads).items():
            var.assign(start[name])
        attempts = _update(exact, [union], attempts)
        floor = _difference(exact.trainable_variables, union_weights, initial)
    if tolerance is None:
        tolerance = fixed if floor[0] is None else max(fixed, 2 * floor[0])
    return VerifyReport(steps, [len(m[1]) for m in micro], *difference, tolerance, attempts,
                        *floor)  # fmt: skip


def _update(model, batches: list[tuple], attempts: int) -> int:
    """Fits `model` on the window until it has made one more update. Under float16 a window
    can overflow and be skipped (the engine then halves the loss scale): it is retried, or
    the check would be vacuous. Returns the windows tried so far."""
    done = int(model.optimizer.iterations.numpy())
    while int(model.optimizer.iterations.numpy()) == done:
        attempts += 1
        if attempts > 40:
            raise RuntimeError("verify-accumulation: every window overflowed; check the data")
        model.fit(_as_dataset(batches), verbose=0)
    return attempts


def _difference(variables, reference, initial: list) -> tuple[float, float]:
    """max |Δw - Δw_ref| / max |Δw_ref| and ‖Δw - Δw_ref‖ / ‖Δw_ref‖, variable by variable
    (no further weights-sized copies)."""
    largest, diff_max, squares, diff_squares = 0.0, 0.0, 0.0, 0.0
    for var, ref, w0 in zip(variables, reference, initial, strict=True):
        delta_ref = ref - w0
        diff = var.numpy() - ref
        largest = max(largest, float(np.max(np.abs(delta_ref), initial=0.0)))
        diff_max = max(diff_max, float(np.max(np.abs(diff), initial=0.0)))
        squares += float(np.sum(np.square(delta_ref.astype(np.float64))))
        diff_squares += float(np.sum(np.square(diff.astype(np.float64))))
    return diff_max / max(largest, 1e-30), float(
        np.sqrt(diff_squares) / max(np.sqrt(squares), 1e-30)
    )


def _deterministic(config: ExperimentConfig) -> ExperimentConfig:
    """The config with every random draw of training off: dropout of every kind (the
    attention weights' and the pre-encoder's too, when set apart from `dropout`), stochastic
    depth and SpecAugment."""
    model, encoder = config.model, config.model.encoder
    off = {"dropout": 0.0}
    for key in ("attention_dropout", "pre_encoder_dropout", "stochastic_depth"):
        if getattr(encoder, key, None):  # set on this kind and not 0: switched off
            off[key] = 0.0
    model = dataclasses.replace(
        model,
        encoder=dataclasses.replace(encoder, **off),
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
