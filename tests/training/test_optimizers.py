"""`train.optimizer`: the factored Adafactor makes Keras' Adafactor updates with a fraction
of its state; AdamW makes torch's AdamW updates (NumPy, from torch's documented rule)."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from asrkit.training.optimizers import AdamW, FactoredAdafactor, build_optimizer
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


def _torch_adamw(steps, lr, betas, eps, decay, seed=0):
    """torch.optim.AdamW's documented update in NumPy, on _run's weights and gradients."""
    rng = np.random.default_rng(seed)
    weights = [rng.standard_normal(s).astype(np.float64) for s in SHAPES]
    m = [np.zeros_like(w) for w in weights]
    v = [np.zeros_like(w) for w in weights]
    for t in range(1, steps + 1):
        for i, shape in enumerate(SHAPES):
            g = rng.standard_normal(shape)
            weights[i] = weights[i] * (1 - lr * decay)
            m[i] = betas[0] * m[i] + (1 - betas[0]) * g
            v[i] = betas[1] * v[i] + (1 - betas[1]) * g * g
            m_hat, v_hat = m[i] / (1 - betas[0] ** t), v[i] / (1 - betas[1] ** t)
            weights[i] = weights[i] - lr * m_hat / (np.sqrt(v_hat) + eps)
    return weights


def test_adamw_makes_torchs_adamw_updates():
    """Epsilon after the bias correction, as torch (and so NeMo) adds it; gradients as small
    as epsilon would tell Keras' placement apart."""
    lr, betas, eps, decay = 0.01, (0.9, 0.98), 1e-3, 0.1  # a large epsilon: the test bites
    got = _run(AdamW(lr, beta_1=betas[0], beta_2=betas[1], epsilon=eps, weight_decay=decay))
    want = _torch_adamw(6, lr, betas, eps, decay)
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)
    keras_placement = _run(keras.optimizers.AdamW(lr, beta_1=betas[0], beta_2=betas[1],
                                                  epsilon=eps, weight_decay=decay))  # fmt: skip
    assert max(np.abs(k - w).max() for k, w in zip(keras_placement, want, strict=True)) > 1e-4
    assert isinstance(build_optimizer("adamw", lr, decay, betas, eps), AdamW)


def test_adamw_from_its_config_makes_the_same_updates_and_decays_once():
    """The decay lives in AdamW's own update (Keras' base optimizer is given none): a
    config round trip keeps it, and a rate of 0 is plain Adam with torch's epsilon."""
    lr, betas, eps, decay = 0.01, (0.9, 0.98), 1e-3, 0.1
    optimizer = AdamW(lr, beta_1=betas[0], beta_2=betas[1], epsilon=eps, weight_decay=decay)
    assert optimizer.get_config()["weight_decay"] == decay
    for g, w in zip(_run(AdamW.from_config(optimizer.get_config())),
                    _torch_adamw(6, lr, betas, eps, decay), strict=True):  # fmt: skip
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)
    no_decay = _run(AdamW(lr, beta_1=betas[0], beta_2=betas[1], epsilon=eps, weight_decay=0.0))
    for g, w in zip(no_decay, _torch_adamw(6, lr, betas, eps, 0.0), strict=True):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)
