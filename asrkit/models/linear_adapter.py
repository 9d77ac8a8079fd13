"""NeMo's linear adapter for Conformer blocks: x + up(swish(down(LayerNorm(x)))), both
linears without bias, `up` initialised to zeros so that an added adapter leaves the block's
output as it was; applied to each block's output (NeMo's adapter location "post", after the
block's own final norm). A residual bottleneck of `dim` units that fine-tuning trains while
the network around it stays frozen (`model.adapters.kind: linear`)."""

from __future__ import annotations

import keras

from asrkit.models.layers import CompositeLayer


@keras.saving.register_keras_serializable(package="asrkit")
class LinearAdapter(CompositeLayer):
    def __init__(self, *, d_model: int, dim: int, epsilon: float = 1e-5, **kwargs):
        super().__init__(**kwargs)
        self.d_model, self.dim, self.epsilon = d_model, dim, epsilon
        self.norm = keras.layers.LayerNormalization(epsilon=epsilon)
        self.down = keras.layers.Dense(dim, use_bias=False)
        self.up = keras.layers.Dense(d_model, use_bias=False, kernel_initializer="zeros")

    def call(self, x):
        return x + self.up(keras.activations.silu(self.down(self.norm(x))))

    def get_config(self):
        return {**super().get_config(), "d_model": self.d_model, "dim": self.dim,
                "epsilon": self.epsilon}  # fmt: skip
