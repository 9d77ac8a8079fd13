"""Training: the accumulation engine (and later the train loop, schedules, checkpoints)."""

from asrkit.training.accumulation import AccumulatingModel, AccumulationSettings, WindowMean
from asrkit.training.loss_scale import LossScaleSettings

__all__ = ["AccumulatingModel", "AccumulationSettings", "LossScaleSettings", "WindowMean"]
