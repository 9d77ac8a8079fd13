"""An optimizer that records the gradient it is applied with: what a test compares an
update's gradient through (the accumulation engine's window against the union's, against
NeMo's)."""

import keras

from asrkit.training.keras_hooks import variable_index


class Recorder(keras.optimizers.Optimizer):
    """An optimizer that only keeps the gradient it is applied with (`seen`, one per
    variable, in the variables' order)."""

    def build(self, var_list):
        if self.built:
            return
        super().build(var_list)
        self.seen = [self.add_variable_from_reference(v, name="seen") for v in var_list]

    def update_step(self, gradient, variable, learning_rate):
        self.assign(self.seen[variable_index(self, variable)], gradient)
