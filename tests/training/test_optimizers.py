"""`train.optimizer`: the factored Adafactor makes Keras' Adafactor updates with a fraction
of its state."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from asrkit.training.optimizers import FactoredAdafactor, build_optimizer
from asrkit.training.schedules import WarmupInverseSqrt

SHAPES = [(6, 4), (3, 5, 2), (7,), ()]


def _run(optimizer, steps=6, seed=0):
    rng = np.random.default_rng(seed)
    variables = [keras.Variable(rng.standard_normal(s).astype(np.float32)) for s in SHAPES]
    optimizer.build(variables)
    for _ in range(steps):
        grads = [tf.constant(rng.standard_normal(s).astype(np.float32)) for s in SHAPES]
        optimizer.apply(grads, variables)
    return [v.numpy() for v in variables]


def _slot_sizes(optimizer) -> int:
    return sum(int(np.prod(v.shape)) for v in optimizer.variables if len(v.shape) > 0)


@pytest.mark.parametrize("learning_rate", [0.05, "schedule"])
def test_the_factored_adafactor_makes_keras_adafactor_updates(learning_rate):
    """Matrices, a rank-3 weight, a vector and a scalar, six updates with weight decay, a
    constant learning rate (Adafactor's relative step then applies) or a schedule."""

    def rate():
        return WarmupInverseSqrt(0.05, 2) if learning_rate == "schedule" else learning_rate

    got = _run(FactoredAdafactor(rate(), weight_decay=0.01))
    want = _run(keras.optimizers.Adafactor(rate(), weight_decay=0.01))
    start = _run(keras.optimizers.SGD(0.0), steps=0)
    for g, w, s in zip(got, want, start, strict=True):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)
        assert not np.allclose(g, s)  # it moved


def test_its_state_is_the_row_and_column_factors_only():
    ours, keras_own = FactoredAdafactor(0.1), keras.optimizers.Adafactor(0.1)
    _run(ours, steps=1), _run(keras_own, steps=1)
    # (6, 4): 6 + 4; (3, 5, 2): 3·5 + 3·2; (7,): 7 (a vector keeps its own); scalars, like
    # the iteration count, are not counted
    assert _slot_sizes(ours) == 10 + 21 + 7
    assert _slot_sizes(keras_own) == _slot_sizes(ours) + 24 + 30  # + a full slot per matrix
    adamw = build_optimizer("adamw", 0.1, 0.01)
    _run(adamw, steps=1)
    assert _slot_sizes(adamw) == 2 * (24 + 30 + 7)
