"""Loss-scaling settings for float16 training, and unwrapping of a user's LossScaleOptimizer.

The accumulation engine scales the loss itself and decides on finiteness from the
all-reduced window gradient, so it always drives the *inner* optimizer. Whatever the
user passed (a plain optimizer or a `keras.optimizers.LossScaleOptimizer`), exactly one
loss scale is applied: never two, never none under `mixed_float16`.
"""

from __future__ import annotations

from dataclasses import dataclass

import keras


@dataclass(frozen=True)
class LossScaleSettings:
    """Dynamic loss scaling: start at `initial_scale`, halve on a non-finite window
    gradient (never below 1), double after `growth_steps` consecutive finite updates."""

    enabled: bool
    initial_scale: float = 2.0**15
    growth_steps: int = 2000


def unwrap_optimizer(
    optimizer: keras.optimizers.Optimizer, policy_name: str
) -> tuple[keras.optimizers.Optimizer, LossScaleSettings]:
    """Returns the optimizer that applies updates and the loss scaling to use.

    Loss scaling is enabled under `mixed_float16` (bfloat16 has float32's exponent range
    and needs none) or whenever the user asked for it with a LossScaleOptimizer.
    """
    if isinstance(optimizer, keras.optimizers.LossScaleOptimizer):
        inner = optimizer.inner_optimizer
        settings = LossScaleSettings(
            enabled=True,
            initial_scale=float(optimizer.initial_scale),
            growth_steps=int(optimizer.dynamic_growth_steps),
        )
    else:
        inner = optimizer
        settings = LossScaleSettings(enabled=policy_name == "mixed_float16")
    _reject_unsupported(inner)
    return inner, settings


def _reject_unsupported(optimizer: keras.optimizers.Optimizer) -> None:
    """Optimizer options that would act per micro-step or per replica are refused."""
    if getattr(optimizer, "gradient_accumulation_steps", None):
        raise ValueError(
            "AccumulatingModel: the optimizer has gradient_accumulation_steps="
            f"{optimizer.gradient_accumulation_steps}; pass accumulation_steps to compile() "
            "instead (Keras' built-in accumulation counts micro-steps and breaks under "
            "tf.distribute)."
        )
    for name in ("clipnorm", "clipvalue", "global_clipnorm"):
        if getattr(optimizer, name, None) is not None:
            raise ValueError(
                f"AccumulatingModel: the optimizer has {name} set; Keras clips each replica's "
                "gradient before the all-reduce. Use compile(clip_global_norm=...), which "
                "clips the all-reduced window gradient."
            )
    if getattr(optimizer, "loss_scale_factor", None) is not None:
        raise ValueError(
            "AccumulatingModel: the optimizer has loss_scale_factor set; the engine scales "
            "the loss itself under mixed_float16 (or pass a LossScaleOptimizer)."
        )
