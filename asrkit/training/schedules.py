"""Learning-rate schedules. The step they see is `optimizer.iterations`, which the
accumulation engine advances once per update: warm-up lengths are counted in updates."""

from __future__ import annotations

import keras
import tensorflow as tf


@keras.saving.register_keras_serializable(package="asrkit")
class WarmupInverseSqrt(keras.optimizers.schedules.LearningRateSchedule):
    """Linear warm-up to `peak` over `warmup` updates, then peak · sqrt(warmup / update)."""

    def __init__(self, peak: float, warmup: int):
        self.peak, self.warmup = float(peak), max(int(warmup), 1)

    def __call__(self, step):
        step = tf.cast(step, tf.float32) + 1.0
        warmup = float(self.warmup)
        return self.peak * tf.minimum(step / warmup, tf.sqrt(warmup / step))

    def get_config(self):
        return {"peak": self.peak, "warmup": self.warmup}
