"""Training: the accumulation engine, the transducer training task, the train loop,
schedules, callbacks, several workers and the accumulation check.

The engine's names load TensorFlow when first used, so that `asrkit.training.cluster` (the
worker list a command checks before any work) stays light."""

__all__ = ["AccumulatingModel", "AccumulationSettings", "LossScaleSettings", "WindowMean"]


def __getattr__(name: str):
    if name in ("AccumulatingModel", "AccumulationSettings", "WindowMean"):
        from asrkit.training import accumulation

        return getattr(accumulation, name)
    if name == "LossScaleSettings":
        from asrkit.training.loss_scale import LossScaleSettings

        return LossScaleSettings
    raise AttributeError(f"module 'asrkit.training' has no attribute {name!r}")
