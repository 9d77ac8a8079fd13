"""Training: the accumulation engine, the transducer training task, the train loop,
schedules, callbacks and the accumulation check."""

from asrkit.training.accumulation import AccumulatingModel, AccumulationSettings, WindowMean
from asrkit.training.loss_scale import LossScaleSettings

__all__ = ["AccumulatingModel", "AccumulationSettings", "LossScaleSettings", "WindowMean"]
