"""What training holds in device memory before the first activation: the weights (float32
master copies, under mixed precision too), the optimizer's slots and the accumulation
buffers (one float32 per trainable weight). Counted from the built network's variables, so
`asrkit plan` can refuse a budget that cannot hold them before it reads any data or starts
measuring."""

from __future__ import annotations

import math
from dataclasses import dataclass

from asrkit.config import ExperimentConfig
from asrkit.errors import UserError
from asrkit.sizes import format_bytes

_FLOAT32 = 4


class StateTooLarge(UserError, ValueError):
    """The weights, slots and accumulators alone exceed the usable budget."""


@dataclass(frozen=True)
class TrainingState:
    parameters: int
    trainable_parameters: int
    weights: int  # bytes
    slots: int  # bytes of the optimizer's state
    accumulators: int  # bytes
    optimizer: str
    # what freezing the whole encoder would leave of slots + accumulators
    frozen_encoder_slots: int
    frozen_encoder_accumulators: int
    # what train.optimizer=adafactor would make the slots
    factored_slots: int

    @property
    def total(self) -> int:
        return self.weights + self.slots + self.accumulators

    def describe(self) -> str:
        name = {"adamw": "AdamW", "adafactor": "Adafactor"}[self.optimizer]
        return (
            f"weights {format_bytes(self.weights)} ({self.parameters / 1e6:.1f} M parameters, "
            f"{self.trainable_parameters / 1e6:.1f} M trained) + {name} slots "
            f"{format_bytes(self.slots)} + accumulators {format_bytes(self.accumulators)} "
            f"= {format_bytes(self.total)}"
        )


def slot_count(optimizer: str, shape) -> int:
    """Numbers of optimizer state a weight of `shape` gets."""
    size = math.prod(shape)
    if optimizer == "adafactor" and len(shape) >= 2:
        return math.prod(shape[:-1]) + math.prod(shape[:-2]) * shape[-1]
    return 2 * size if optimizer == "adamw" else size


def training_state(config: ExperimentConfig, vocab_size: int) -> TrainingState:
    """Builds the network on the CPU (weights only: no optimizer, no buffers) and counts."""
    import tensorflow as tf

    from asrkit.models.transducer import Transducer
    from asrkit.training.adapting import apply_adapters
    from asrkit.training.setup import freeze_encoder

    with tf.device("CPU:0"):
        network = Transducer(vocab_size, config.model)
        network.build_from_features(config.features.num_mel_bins)
        apply_adapters(network, config)  # the factors and train.trainable train
    freeze_encoder(network, config.train.freeze_encoder)
    trained = [tuple(v.shape) for v in network.trainable_weights]
    encoder = {id(v) for v in network.encoder.trainable_weights}
    outside = [tuple(v.shape) for v in network.trainable_weights if id(v) not in encoder]
    kind = config.train.optimizer
    parameters = sum(math.prod(v.shape) for v in network.weights)
    trainable = sum(math.prod(s) for s in trained)
    del network
    return TrainingState(
        parameters=parameters,
        trainable_parameters=trainable,
        weights=_FLOAT32 * parameters,
        slots=_FLOAT32 * sum(slot_count(kind, s) for s in trained),
        accumulators=_FLOAT32 * trainable,
        optimizer=kind,
        frozen_encoder_slots=_FLOAT32 * sum(slot_count(kind, s) for s in outside),
        frozen_encoder_accumulators=_FLOAT32 * sum(math.prod(s) for s in outside),
        factored_slots=_FLOAT32 * sum(slot_count("adafactor", s) for s in trained),
    )


def check_state_fits(state: TrainingState, budget: int, margin: float) -> None:
    """Refuses a budget whose usable part cannot hold the training state, naming the sizes
    and the levers that shrink them."""
    usable = int(budget * (1 - margin))
    if state.total <= usable:
        return
    levers = []
    if state.optimizer == "adamw":
        levers.append(
            f"train.optimizer=adafactor (slots {format_bytes(state.slots)} -> "
            f"{format_bytes(state.factored_slots)})"
        )
    frozen = state.frozen_encoder_slots + state.frozen_encoder_accumulators
    if frozen < state.slots + state.accumulators:
        levers.append(
            f"train.freeze_encoder=-1 (slots + accumulators "
            f"{format_bytes(state.slots + state.accumulators)} -> {format_bytes(frozen)}) or "
            "its first N blocks"
        )
    raise StateTooLarge(
        f"the training state alone does not fit: {state.describe()}, more than the usable "
        f"{format_bytes(usable)} ({format_bytes(budget)} less the {margin:.0%} margin), with "
        "nothing left for activations. Mixed precision does not shrink it (the weights stay "
        "float32). "
        + (f"Levers: {'; '.join(levers)}; or more --memory." if levers else "Give more --memory.")
    )
