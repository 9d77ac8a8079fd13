"""Learning-rate schedules. The step they see is `optimizer.iterations`, which the
accumulation engine advances once per update: warm-up lengths are counted in updates."""

from __future__ import annotations

import math

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


@keras.saving.register_keras_serializable(package="asrkit")
class WarmupCosine(keras.optimizers.schedules.LearningRateSchedule):
    """Linear warm-up to `peak` over `warmup` updates, then a half cosine from `peak` to
    `peak · final_ratio` at update `total` (held there after it)."""

    def __init__(self, peak: float, warmup: int, total: int, final_ratio: float = 0.0):
        self.peak, self.warmup = float(peak), max(int(warmup), 1)
        self.total, self.final_ratio = max(int(total), self.warmup + 1), float(final_ratio)

    def __call__(self, step):
        step = tf.cast(step, tf.float32) + 1.0
        warmup = float(self.warmup)
        progress = tf.clip_by_value((step - warmup) / float(self.total - self.warmup), 0.0, 1.0)
        cosine = 0.5 * (1.0 + tf.cos(math.pi * progress))
        decayed = self.final_ratio + (1.0 - self.final_ratio) * cosine
        return self.peak * tf.where(step < warmup, step / warmup, decayed)

    def get_config(self):
        return {
            "peak": self.peak,
            "warmup": self.warmup,
            "total": self.total,
            "final_ratio": self.final_ratio,
        }
