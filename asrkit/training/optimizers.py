"""The optimizers `train.optimizer` names, and what their state costs in memory.

`adamw` keeps two float32 slots per weight (first and second moments): 8 bytes per
parameter, 4.8 GB for a 0.6 B model, more than its weights. Its update is torch's AdamW
(NeMo's optimizer): epsilon is added to the bias-corrected root mean square, where Keras'
AdamW adds it before the correction (a difference that matters for small gradients). Each
weight's update, decay included, is one loop over the weight, its two slots and its
gradient (compiled by XLA), where Keras' ops make a dozen passes and TensorFlow's fused
Adam kernel plus Keras' decay five (the update is memory-bound: at 0.6 B one loop alone
moves 16 GB).
`adafactor` (Shazeer & Stern, 2018) keeps no first moment and, for every matrix, only the
row and column means of the squared gradients: its state is a few bytes per row and column.
Keras' `Adafactor` computes the same update but stores the factored second moment expanded
to a full-size slot per matrix as well (4 bytes per parameter); `FactoredAdafactor`
rebuilds it on the fly instead.

Both are plain Keras optimizers: the accumulation engine applies them once per window with
the reduced gradient, like any other.
"""

from __future__ import annotations

import keras
import tensorflow as tf
from keras import ops

from asrkit.training.keras_hooks import variable_index


class FactoredAdafactor(keras.optimizers.Adafactor):
    """Keras' Adafactor update, with the second moment of a matrix (or of the last two
    axes of a higher-rank weight) kept only as its row and column factors. Vectors and
    scalars keep a full second moment, as in Keras'."""

    def build(self, var_list):
        if self.built:
            return
        keras.optimizers.Optimizer.build(self, var_list)
        self._r, self._c, self._v = [], [], []
        for var in var_list:
            factored = len(var.shape) >= 2
            self._r.append(
                self.add_variable(shape=var.shape[:-1], dtype=var.dtype, name=f"{var.name}_row")
                if factored else None
            )  # fmt: skip
            self._c.append(
                self.add_variable(shape=(*var.shape[:-2], var.shape[-1]), dtype=var.dtype,
                                  name=f"{var.name}_column")
                if factored else None
            )  # fmt: skip
            self._v.append(
                None if factored else self.add_variable_from_reference(var, name="velocity")
            )

    def update_step(self, gradient, variable, learning_rate):
        lr = ops.cast(learning_rate, variable.dtype)
        gradient = ops.cast(gradient, variable.dtype)
        one = ops.cast(1.0, variable.dtype)
        step = ops.cast(self.iterations + 1, variable.dtype)
        if not callable(self._learning_rate) and self.relative_step:
            lr = ops.minimum(lr, 1 / ops.sqrt(step))
        rho = ops.minimum(lr, 1 / ops.sqrt(step))
        alpha = ops.maximum(ops.cast(self.epsilon_2, variable.dtype), self._rms(variable)) * rho
        squared = ops.square(gradient) + self.epsilon_1
        beta = 1 - ops.power(step, self.beta_2_decay)
        index = variable_index(self, variable)
        r, c, v = self._r[index], self._c[index], self._v[index]
        if v is None:
            self.assign(r, beta * r + (1 - beta) * ops.mean(squared, axis=-1))
            self.assign(c, beta * c + (1 - beta) * ops.mean(squared, axis=-2))
            second = ops.expand_dims(r / ops.mean(r, axis=-1, keepdims=True), -1)
            second = second * ops.expand_dims(c, -2)
        else:
            self.assign(v, beta * v + (1 - beta) * squared)
            second = v
        update = gradient / ops.sqrt(second)
        update = update / ops.maximum(one, self._rms(update) / self.clip_threshold)
        self.assign_sub(variable, alpha * update)


class AdamW(keras.optimizers.Optimizer):
    """torch's AdamW: w ← w − lr · wd · w, then w ← w − lr · m̂ / (√v̂ + ε) with the
    bias-corrected moments m̂ = m / (1 − β₁ᵗ), v̂ = v / (1 − β₂ᵗ). Its slots are Keras'
    AdamW's (a `momentum` and a `velocity` per weight, in that order). Every weight decays,
    as in torch's default parameter group (NeMo's)."""

    def __init__(self, learning_rate=1e-3, beta_1=0.9, beta_2=0.999, epsilon=1e-8,
                 weight_decay=0.01, name="adamw", **kwargs):  # fmt: skip
        # The decay is part of `update_step`'s one loop, not Keras' own pass.
        super().__init__(learning_rate=learning_rate, name=name, **kwargs)
        self.beta_1, self.beta_2, self.epsilon = beta_1, beta_2, epsilon
        self.decay = weight_decay or 0.0

    def build(self, var_list):
        if self.built:
            return
        super().build(var_list)
        self._m = [self.add_variable_from_reference(v, name="momentum") for v in var_list]
        self._v = [self.add_variable_from_reference(v, name="velocity") for v in var_list]

    def update_step(self, gradient, variable, learning_rate):
        dtype = variable.dtype
        index = variable_index(self, variable)
        _adamw_step(
            _handle(variable), _handle(self._m[index]), _handle(self._v[index]),
            tf.cast(tf.convert_to_tensor(gradient), dtype), tf.cast(learning_rate, dtype),
            tf.cast(self.decay, dtype), tf.cast(self.beta_1, dtype), tf.cast(self.beta_2, dtype),
            tf.cast(self.epsilon, dtype), tf.cast(self.iterations + 1, dtype),
        )  # fmt: skip

    def get_config(self):
        return {**super().get_config(), "beta_1": self.beta_1, "beta_2": self.beta_2,
                "epsilon": self.epsilon, "weight_decay": self.decay}  # fmt: skip


@tf.function(jit_compile=True, autograph=False)
def _adamw_step(weight, m, v, gradient, lr, decay, beta_1, beta_2, epsilon, step):
    """One weight's AdamW update in torch's order and arithmetic, on resource handles: XLA
    fuses it into one loop that reads the weight, both slots and the gradient once and
    writes the three once (compiled once per weight shape)."""
    dtype = gradient.dtype
    read = lambda handle: tf.raw_ops.ReadVariableOp(resource=handle, dtype=dtype)  # noqa: E731
    old_m = read(m)
    new_m = old_m + (gradient - old_m) * (1 - beta_1)
    new_v = read(v) * beta_2 + gradient * gradient * (1 - beta_2)
    denominator = tf.sqrt(new_v) / tf.sqrt(1 - beta_2**step) + epsilon
    new_weight = read(weight) * (1 - lr * decay) - lr / (1 - beta_1**step) * new_m / denominator
    for handle, value in ((m, new_m), (v, new_v), (weight, new_weight)):
        tf.raw_ops.AssignVariableOp(resource=handle, value=value)


def _handle(variable):
    """The resource handle of a Keras or TensorFlow variable (a replica's own, inside a
    strategy's update)."""
    return (variable.value if isinstance(variable, keras.Variable) else variable).handle


def build_optimizer(kind: str, learning_rate, weight_decay: float, betas=(0.9, 0.999),
                    epsilon: float = 1e-8):  # fmt: skip
    """`train.optimizer` as a Keras optimizer with the given schedule and decoupled weight
    decay (both apply the decay as lr · decay · w); `betas` and `epsilon` are AdamW's."""
    if kind == "adafactor":
        return FactoredAdafactor(learning_rate, weight_decay=weight_decay or None)
    return AdamW(learning_rate, beta_1=betas[0], beta_2=betas[1], epsilon=epsilon,
                 weight_decay=weight_decay)  # fmt: skip
