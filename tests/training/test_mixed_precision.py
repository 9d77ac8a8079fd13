"""Mixed precision: one loss scale, by the engine; fp32 accumulators; overflow lowers the scale."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from tests.training.toy import TokenRegressor, make_batches, make_dataset, weights, windows_of

SIZES = [3, 5, 2, 7, 4, 1, 6]


@pytest.fixture
def policy():
    def use(name):
        keras.mixed_precision.set_dtype_policy(name)

    yield use
    keras.mixed_precision.set_dtype_policy("float32")


def build(optimizer, steps=3, batches=None):
    keras.utils.set_random_seed(1)
    model = TokenRegressor()
    model.compile(optimizer, accumulation_steps=steps)
    model.build_engine(batches[0])
    return model


def scaled_union_reference(model_initial, windows, scale):
    """Same policy, the union of each window as one batch, the loss scaled by hand."""
    model = TokenRegressor()
    model.compute_loss_terms(windows[0][0], training=False)
    for var, value in zip(model.trainable_variables, model_initial, strict=True):
        var.assign(value)
    optimizer = keras.optimizers.SGD(0.1)
    for window in windows:
        union = tuple(np.concatenate([b[i] for b in window]) for i in range(3))
        with tf.GradientTape() as tape:
            loss_sum, count = model.compute_loss_terms(union)
            scaled = loss_sum * scale
        grads = [g / (scale * count) for g in tape.gradient(scaled, model.trainable_variables)]
        optimizer.apply(grads, model.trainable_variables)
    return weights(model)


@pytest.mark.parametrize("wrap", [False, True], ids=["plain", "loss_scale_optimizer"])
def test_mixed_float16_equals_its_large_batch_run(policy, wrap):
    policy("mixed_float16")
    # Small targets keep Σ-loss gradients × 2**15 inside float16's range: no window skips.
    batches = [(x * 0.1, y * 1e-2, t) for x, y, t in make_batches(SIZES)]
    # SGD: Adam's first steps are ±lr whatever the gradient's size, which would turn
    # float16 noise in near-zero gradient entries into full-size differences.
    optimizer = keras.optimizers.SGD(0.1)
    if wrap:
        optimizer = keras.optimizers.LossScaleOptimizer(optimizer, initial_scale=2.0**10)
    model = build(optimizer, batches=batches)
    # Exactly one loss scale: the engine drives the inner optimizer, never a wrapper.
    assert not isinstance(model.optimizer, keras.optimizers.LossScaleOptimizer)
    assert model.accumulation.loss_scale.enabled
    scale = 2.0**10 if wrap else 2.0**15
    assert model.loss_scale == scale
    assert model.hidden.compute_dtype == "float16"
    assert all(acc.dtype == tf.float32 for acc in model._engine.grads)
    initial = weights(model)
    history = model.fit(make_dataset(batches), verbose=0)
    # The union batch needs a smaller scale than its micro-batches to stay finite in float16.
    want = scaled_union_reference(initial, windows_of(batches, 3), 2.0**8)
    for got, ref in zip(weights(model), want, strict=True):
        np.testing.assert_allclose(got, ref, rtol=2e-3, atol=2e-4)  # float16 noise
    assert history.history["loss_scale"][0] == scale
    assert history.history["skipped_windows"][0] == 0
    moved = max(np.max(np.abs(a - b)) for a, b in zip(weights(model), initial, strict=True))
    assert moved > 1e-3


@pytest.mark.parametrize("steps", [1, 2])  # 1: no accumulators
def test_overflow_skips_window_and_halves_the_loss_scale(policy, steps):
    policy("mixed_float16")
    batches = make_batches([4, 4, 4, 4])
    x, y, tokens = batches[0]
    batches[0] = (x * 6e4, y, tokens)  # float16 overflows in the forward pass
    optimizer = keras.optimizers.LossScaleOptimizer(keras.optimizers.SGD(0.01), initial_scale=16)
    model = build(optimizer, steps=steps, batches=batches)
    history = model.fit(make_dataset(batches), verbose=0)
    assert history.history["skipped_windows"][0] == 1
    assert int(model.optimizer.iterations.numpy()) == 4 // steps - 1
    assert model.loss_scale == 8.0


def test_loss_scale_grows_after_finite_updates(policy):
    policy("mixed_float16")
    batches = make_batches([2, 2, 2, 2])
    optimizer = keras.optimizers.LossScaleOptimizer(
        keras.optimizers.SGD(0.01), initial_scale=8.0, dynamic_growth_steps=2
    )
    model = build(optimizer, steps=1, batches=batches)
    model.fit(make_dataset(batches), verbose=0)
    assert model.loss_scale == 32.0  # 4 finite updates, doubled every 2


def test_mixed_bfloat16_runs_without_loss_scaling(policy):
    policy("mixed_bfloat16")
    batches = make_batches(SIZES)
    model = build(keras.optimizers.Adam(0.01), batches=batches)
    assert not model.accumulation.loss_scale.enabled
    assert model.loss_scale == 1.0
    history = model.fit(make_dataset(batches), epochs=2, verbose=0)
    assert "loss_scale" not in history.history
    assert np.all(np.isfinite(history.history["loss"]))
    assert int(model.optimizer.iterations.numpy()) == 6


@pytest.mark.parametrize(("built_under", "compiled_under"),
                         [("mixed_float16", "float32"), ("float32", "mixed_float16")])  # fmt: skip
def test_loss_scaling_follows_the_model_policy_not_the_global_one(
    policy, built_under, compiled_under
):
    policy(built_under)
    model = TokenRegressor()
    policy(compiled_under)
    model.compile(keras.optimizers.SGD(0.1), accumulation_steps=2)
    assert model.accumulation.loss_scale.enabled == (built_under == "mixed_float16")
