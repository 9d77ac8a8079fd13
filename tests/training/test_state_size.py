"""The training state `asrkit plan` checks before measuring: counted from the network's
shapes, it equals what a built training task really holds."""

import math

import numpy as np
import pytest

from asrkit.config import load_config
from asrkit.training.probe import fabricated_batch
from asrkit.training.setup import build_task
from asrkit.training.state_size import StateTooLarge, check_state_fits, training_state

TINY = ["model.encoder.kind=conformer", "model.encoder.d_model=16", "model.encoder.num_blocks=2",
        "model.encoder.num_heads=2", "model.encoder.kernel_size=5",
        "model.encoder.subsampling_filters=8", "model.predictor.units=16",
        "model.predictor.embed_dim=8", "model.joint_dim=16"]  # fmt: skip


def _bytes(variables) -> int:
    return sum(
        math.prod(v.shape) * np.dtype(getattr(v.dtype, "as_numpy_dtype", v.dtype)).itemsize
        for v in variables
    )


@pytest.mark.parametrize("overrides", [[], ["train.optimizer=adafactor"],
                                       ["train.freeze_encoder=-1"],
                                       ["train.freeze_encoder=1", "train.optimizer=adafactor"],
                                       ["train.precision=mixed_bfloat16"],
                                       ["model.adapters.kind=lora"],
                                       ["model.adapters.kind=lora", "train.optimizer=adafactor",
                                        "model.adapters.targets=[convolution, joint]"],
                                       ])  # fmt: skip
def test_the_counted_state_is_what_a_built_task_holds(overrides):
    import keras

    config = load_config(None, TINY + overrides)
    state = training_state(config, 11)
    try:
        keras.mixed_precision.set_dtype_policy(config.train.precision)
        task = build_task(config, 11, steps=2)
        task.build_engine(fabricated_batch(1, 16, 1, config.features.num_mel_bins))
    finally:
        keras.mixed_precision.set_dtype_policy("float32")
    slots = [v for v in task.optimizer.variables if len(v.shape) > 0]
    assert state.weights == _bytes(task.network.weights)  # float32 masters
    assert state.slots == _bytes(slots)
    assert state.accumulators == _bytes(task._engine.grads)
    assert state.trainable_parameters == sum(math.prod(v.shape) for v in task.trainable_variables)


def test_the_levers_are_what_the_changed_config_would_hold():
    adamw = training_state(load_config(None, TINY), 11)
    frozen = training_state(load_config(None, [*TINY, "train.freeze_encoder=-1"]), 11)
    factored = training_state(load_config(None, [*TINY, "train.optimizer=adafactor"]), 11)
    assert adamw.frozen_encoder_slots == frozen.slots
    assert adamw.frozen_encoder_accumulators == frozen.accumulators
    assert adamw.factored_slots == factored.slots < adamw.slots / 4


def test_a_budget_below_the_state_names_every_size_and_the_levers():
    state = training_state(load_config(None, TINY), 11)
    check_state_fits(state, int(state.total / 0.85) + 1, 0.15)  # fits
    with pytest.raises(StateTooLarge) as refused:
        check_state_fits(state, state.total, 0.15)
    message = str(refused.value)
    for words in ("weights", "AdamW slots", "accumulators", "train.optimizer=adafactor",
                  "train.freeze_encoder=-1", "nothing left for activations"):  # fmt: skip
        assert words in message, words
