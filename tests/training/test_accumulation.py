"""One update from N micro-batches == one update from their union, under every condition.

Every test compares against `reference_run`: a plain Keras optimizer applied once per
window to the gradient of Σ loss / Σ count over the window's union as one batch.
"""

import math

import keras
import numpy as np
import pytest
import tensorflow as tf

from asrkit.training.optimizers import AdamW, FactoredAdafactor
from tests.training.toy import (
    TokenRegressor,
    assert_weights_close,
    make_batches,
    make_dataset,
    reference_run,
    weights,
    windows_of,
)

OPTIMIZERS = {
    "sgd": lambda: keras.optimizers.SGD(0.1),
    "momentum": lambda: keras.optimizers.SGD(0.1, momentum=0.9),
    "adam": lambda: keras.optimizers.Adam(0.05),
    "adamw": lambda: keras.optimizers.AdamW(0.05, weight_decay=0.1),
    "adafactor": lambda: FactoredAdafactor(0.05, weight_decay=0.1),
    "torch_adamw": lambda: AdamW(0.05, beta_2=0.98, weight_decay=0.1),
    # EMA overwrites the weights every 2 updates: it must count updates, not micro-steps.
    "adam_ema": lambda: keras.optimizers.Adam(
        0.05, use_ema=True, ema_momentum=0.5, ema_overwrite_frequency=2
    ),
}
SIZES = [3, 5, 2, 7, 4, 1, 6]  # 7 micro-batches, N=3: windows of 3, 3 and a partial 1


def train(batches, optimizer, steps, strategy=None, epochs=1, **compile_kwargs):
    strategy = strategy or tf.distribute.get_strategy()
    with strategy.scope():
        keras.utils.set_random_seed(1)
        model = TokenRegressor()
        model.compile(optimizer, accumulation_steps=steps, **compile_kwargs)
        model.build_engine(batches[0])
    initial = weights(model)
    history = model.fit(make_dataset(batches), epochs=epochs, verbose=0)
    return model, initial, history


@pytest.mark.parametrize("steps", [3, 1])  # 1: windows of one micro-batch, no accumulators
@pytest.mark.parametrize("name", list(OPTIMIZERS))
def test_single_device_equals_union_batch(name, steps):
    batches = make_batches(SIZES)
    model, initial, history = train(batches, OPTIMIZERS[name](), steps=steps)
    assert (model._engine.grads == []) == (steps == 1)
    losses = []
    windows = windows_of(batches, steps)
    want, ref_opt = reference_run(initial, windows, OPTIMIZERS[name](), losses=losses)
    assert_weights_close(weights(model), want)
    assert int(model.optimizer.iterations.numpy()) == len(windows)
    assert int(ref_opt.iterations.numpy()) == len(windows)
    # The epoch loss is Σ loss / Σ count over the epoch (each window at its own weights).
    epoch_loss = sum(s for s, _ in losses) / sum(c for _, c in losses)
    assert history.history["loss"][0] == pytest.approx(epoch_loss, rel=1e-5)
    assert history.history["window_loss"][0] == pytest.approx(losses[-1][0] / losses[-1][1])


def test_unaccumulated_windows_clip_and_skip_as_accumulated_ones():
    """Windows of one micro-batch without accumulators: a NaN micro-batch and one with no
    items are skipped (nothing in the optimizer moves for them), and the global-norm clip
    binds, as in the reference."""
    batches = make_batches([3, 4, 2, 5, 3], seed=3, zero_tokens={3})
    x, y, tokens = batches[1]
    batches[1] = (x, np.full_like(y, np.nan), tokens)
    model, initial, history = train(
        batches, keras.optimizers.SGD(0.1, momentum=0.9), steps=1, clip_global_norm=0.05
    )
    assert model._engine.grads == []
    windows = windows_of(batches, 1)
    want, ref_opt = reference_run(
        initial, windows, keras.optimizers.SGD(0.1, momentum=0.9), clip=0.05, skip={1, 3}
    )
    unclipped, _ = reference_run(
        initial, windows, keras.optimizers.SGD(0.1, momentum=0.9), skip={1, 3}
    )
    assert_weights_close(weights(model), want)
    assert max(np.max(np.abs(a - b)) for a, b in zip(want, unclipped, strict=True)) > 1e-3
    assert int(model.optimizer.iterations.numpy()) == 3 == int(ref_opt.iterations.numpy())
    assert history.history["skipped_windows"][0] == 2
    assert history.history["grad_norm"][0] > 0.05  # the clip did bind


def test_per_micro_batch_means_would_differ():
    """Guard against a vacuous reference: averaging micro-batch means is measurably wrong."""
    batches = make_batches(SIZES)
    model, initial, _ = train(batches, OPTIMIZERS["sgd"](), steps=7)
    want, _ = reference_run(initial, [batches], OPTIMIZERS["sgd"]())
    assert_weights_close(weights(model), want)
    wrong = TokenRegressor()
    wrong.compute_loss_terms(batches[0])
    for var, value in zip(wrong.trainable_variables, initial, strict=True):
        var.assign(value)
    grads = None
    for b in batches:
        with tf.GradientTape() as tape:
            loss_sum, count = wrong.compute_loss_terms(b)
            mean = loss_sum / count / len(batches)
        g = tape.gradient(mean, wrong.trainable_variables)
        grads = g if grads is None else [a + c for a, c in zip(grads, g, strict=True)]
    keras.optimizers.SGD(0.1).apply(grads, wrong.trainable_variables)
    diff = max(np.max(np.abs(a - b)) for a, b in zip(weights(wrong), want, strict=True))
    assert diff > 1e-3


@pytest.mark.parametrize("name", ["sgd", "adamw", "adafactor"])
def test_mirrored_two_replicas_equals_union_batch(mirrored, name):
    # Odd global batches and a global batch of 1 (one replica gets nothing).
    batches = make_batches(SIZES)
    with mirrored.scope():
        optimizer = OPTIMIZERS[name]()
    model, initial, _ = train(batches, optimizer, steps=3, strategy=mirrored)
    want, _ = reference_run(initial, windows_of(batches, 3), OPTIMIZERS[name]())
    assert_weights_close(weights(model), want)
    assert int(model.optimizer.iterations.numpy()) == 3


def test_schedule_counts_updates_not_micro_steps():
    schedule = keras.optimizers.schedules.PiecewiseConstantDecay([1, 2], [0.1, 0.05, 0.01])
    batches = make_batches(SIZES)
    model, initial, history = train(batches, keras.optimizers.SGD(schedule), steps=3)
    want, _ = reference_run(initial, windows_of(batches, 3), keras.optimizers.SGD(schedule))
    assert_weights_close(weights(model), want)
    # After 3 updates the schedule is evaluated at step 3, not at micro-step 7.
    assert float(model.optimizer.learning_rate) == pytest.approx(0.01)
    assert history.history["learning_rate"][0] == pytest.approx(0.01)


@pytest.mark.parametrize("distributed", [False, True])
def test_binding_global_clip_acts_on_the_reduced_window_gradient(mirrored, distributed):
    batches = make_batches(SIZES, seed=3)
    strategy = mirrored if distributed else None
    with (strategy or tf.distribute.get_strategy()).scope():
        optimizer = keras.optimizers.SGD(0.1)
    model, initial, history = train(
        batches, optimizer, steps=3, strategy=strategy, clip_global_norm=0.05
    )
    windows = windows_of(batches, 3)
    want, _ = reference_run(initial, windows, keras.optimizers.SGD(0.1), clip=0.05)
    unclipped, _ = reference_run(initial, windows, keras.optimizers.SGD(0.1))
    assert_weights_close(weights(model), want)
    assert max(np.max(np.abs(a - b)) for a, b in zip(want, unclipped, strict=True)) > 1e-3
    assert history.history["grad_norm"][0] > 0.05  # the clip did bind


def test_inf_on_replica_one_skips_the_window_everywhere(mirrored):
    batches = make_batches(SIZES)
    x, y, tokens = batches[1]
    x = x.copy()
    x[-1, 0] = np.inf  # last item of the global batch: lands on replica 1 only
    batches[1] = (x, y, tokens)
    with mirrored.scope():
        optimizer = keras.optimizers.Adam(0.05)
    model, initial, history = train(batches, optimizer, steps=3, strategy=mirrored)
    want, ref_opt = reference_run(
        initial, windows_of(batches, 3), keras.optimizers.Adam(0.05), skip={0}
    )
    assert_weights_close(weights(model), want)
    assert int(model.optimizer.iterations.numpy()) == 2 == int(ref_opt.iterations.numpy())
    assert history.history["skipped_windows"][0] == 1
    for got, ref in zip(model.optimizer.variables, ref_opt.variables, strict=False):
        if got.shape == ref.shape and "iteration" not in got.path:
            np.testing.assert_allclose(got.numpy(), ref.numpy(), rtol=1e-5, atol=1e-6)


def test_skipped_window_moves_nothing_in_the_optimizer():
    batches = make_batches([4, 4])
    x, y, tokens = batches[0]
    batches[0] = (x, np.full_like(y, np.nan), tokens)
    model, initial, _ = train(batches, keras.optimizers.SGD(0.1, momentum=0.9), steps=2)
    assert int(model.optimizer.iterations.numpy()) == 0
    for var in model.optimizer.variables:
        if "momentum" in var.path:
            assert np.all(var.numpy() == 0.0)
    assert_weights_close(weights(model), initial, rtol=0, atol=0)


def test_a_skipped_windows_nan_sums_do_not_reach_the_next_window():
    """A window skipped for a NaN leaves nothing behind: the next window's update is that
    window's alone, as a reference that never saw the NaN window computes it."""
    batches = make_batches([4, 3, 2, 5])
    x, y, tokens = batches[0]
    batches[0] = (x, np.full_like(y, np.nan), tokens)
    model, initial, history = train(batches, keras.optimizers.SGD(0.1, momentum=0.9), steps=2)
    want, ref_opt = reference_run(
        initial, windows_of(batches, 2), keras.optimizers.SGD(0.1, momentum=0.9), skip={0}
    )
    assert history.history["skipped_windows"][0] == 1
    assert int(model.optimizer.iterations.numpy()) == 1 == int(ref_opt.iterations.numpy())
    assert_weights_close(weights(model), want)


def test_zero_count_window_is_skipped_and_counted():
    batches = make_batches([3, 2, 4, 5], zero_tokens={0, 1})
    model, initial, history = train(batches, keras.optimizers.SGD(0.1), steps=2)
    want, _ = reference_run(initial, windows_of(batches, 2), keras.optimizers.SGD(0.1), skip={0})
    assert_weights_close(weights(model), want)
    assert history.history["skipped_windows"][0] == 1
    assert int(model.optimizer.iterations.numpy()) == 1


def test_too_many_consecutive_skips_stop_training_with_a_clear_error():
    batches = make_batches([2, 2, 2, 2], zero_tokens={0, 1, 2, 3})
    with pytest.raises(RuntimeError, match="consecutive windows were skipped"):
        train(batches, keras.optimizers.SGD(0.1), steps=1, max_consecutive_skips=2)


def test_unknown_length_dataset_and_several_epochs():
    batches = make_batches(SIZES)
    keras.utils.set_random_seed(1)
    model = TokenRegressor()
    model.compile(keras.optimizers.Adam(0.05), accumulation_steps=3)
    model.build_engine(batches[0])
    initial = weights(model)
    model.fit(make_dataset(batches, unknown_length=True), epochs=2, verbose=0)
    # The partial window closes each epoch: 3 updates per epoch, never carried over.
    windows = windows_of(batches, 3) * 2
    want, _ = reference_run(initial, windows, keras.optimizers.Adam(0.05))
    assert_weights_close(weights(model), want)
    assert int(model.optimizer.iterations.numpy()) == 6


@pytest.mark.parametrize("steps", [1, 3])
def test_the_step_is_traced_once_for_every_batch_size_and_epoch(steps):
    """Micro-batches of 3, 5, 2, ... items over two epochs: the loss is traced once (the
    build's eager call aside), for the dataset's element spec, whichever path runs."""
    traces = []

    class Counting(TokenRegressor):
        def compute_loss_terms(self, data, training=True):
            traces.append(tf.executing_eagerly())
            return super().compute_loss_terms(data, training)

    batches = make_batches(SIZES)
    model = Counting()
    model.compile(keras.optimizers.SGD(0.1), accumulation_steps=steps)
    model.build_engine(batches[0])
    model.fit(make_dataset(batches), epochs=2, verbose=0)
    assert traces.count(False) == 1
    assert int(model.optimizer.iterations.numpy()) == 2 * len(windows_of(batches, steps))


def test_jit_compile_equals_union_batch():
    batches = make_batches(SIZES)
    model, initial, _ = train(batches, keras.optimizers.Adam(0.05), steps=3, jit_compile=True)
    want, _ = reference_run(initial, windows_of(batches, 3), keras.optimizers.Adam(0.05))
    assert_weights_close(weights(model), want)


JIT_MIRRORED = {
    "momentum": (lambda: keras.optimizers.SGD(0.1, momentum=0.9), None),
    "adamw_schedule_clip": (
        lambda: keras.optimizers.AdamW(
            keras.optimizers.schedules.PiecewiseConstantDecay([1, 2], [0.05, 0.02, 0.01]),
            weight_decay=0.1,
        ),
        0.5,
    ),
}


@pytest.mark.parametrize("name", list(JIT_MIRRORED))
def test_jit_compile_under_mirrored_equals_union_batch(mirrored, name):
    """Each replica's XLA micro-step touches only its own device's variables."""
    make_optimizer, clip = JIT_MIRRORED[name]
    batches = make_batches(SIZES)  # unequal, odd and a global batch of 1
    with mirrored.scope():
        optimizer = make_optimizer()
    model, initial, history = train(
        batches, optimizer, steps=3, strategy=mirrored, jit_compile=True, clip_global_norm=clip
    )
    want, _ = reference_run(initial, windows_of(batches, 3), make_optimizer(), clip=clip)
    assert_weights_close(weights(model), want)
    assert int(model.optimizer.iterations.numpy()) == 3
    if clip is not None:
        assert history.history["grad_norm"][0] > clip  # the clip did bind in the last window


def test_jit_compile_under_mirrored_skips_a_window_with_inf_on_replica_one(mirrored):
    batches = make_batches(SIZES)
    x, y, tokens = batches[4]
    x = x.copy()
    x[-1, 0] = np.inf  # last item of the global batch: lands on replica 1 only
    batches[4] = (x, y, tokens)
    with mirrored.scope():
        optimizer = keras.optimizers.AdamW(0.05, weight_decay=0.1)
    model, initial, history = train(
        batches, optimizer, steps=3, strategy=mirrored, jit_compile=True, clip_global_norm=0.5
    )
    want, ref_opt = reference_run(
        initial, windows_of(batches, 3), keras.optimizers.AdamW(0.05, weight_decay=0.1),
        clip=0.5, skip={1},
    )  # fmt: skip
    assert_weights_close(weights(model), want)
    assert int(model.optimizer.iterations.numpy()) == 2 == int(ref_opt.iterations.numpy())
    assert history.history["skipped_windows"][0] == 1


def test_checkpoint_restore_continues_exactly(tmp_path):
    batches = make_batches([3, 5, 2, 7, 4, 1])
    full, initial, _ = train(batches, keras.optimizers.Adam(0.05), steps=2, epochs=2)

    first, _, _ = train(batches, keras.optimizers.Adam(0.05), steps=2, epochs=1)
    path = tf.train.Checkpoint(model=first, optimizer=first.optimizer).write(str(tmp_path / "c"))

    keras.utils.set_random_seed(99)  # different init: everything must come from the checkpoint
    resumed = TokenRegressor()
    resumed.compile(keras.optimizers.Adam(0.05), accumulation_steps=2)
    resumed.build_engine(batches[0])
    tf.train.Checkpoint(model=resumed, optimizer=resumed.optimizer).read(path).assert_consumed()
    assert int(resumed.optimizer.iterations.numpy()) == 3
    resumed.fit(make_dataset(batches), epochs=1, verbose=0)
    assert_weights_close(weights(resumed), weights(full), rtol=0, atol=0)
    assert int(resumed.optimizer.iterations.numpy()) == 6
    del initial


def test_rejects_optimizer_options_that_act_per_replica():
    model = TokenRegressor()
    with pytest.raises(ValueError, match="clip_global_norm"):
        model.compile(keras.optimizers.SGD(0.1, global_clipnorm=1.0))
    with pytest.raises(ValueError, match="accumulation_steps"):
        model.compile(keras.optimizers.SGD(0.1, gradient_accumulation_steps=4))
    with pytest.raises(ValueError, match="accumulation_steps must be"):
        model.compile(keras.optimizers.SGD(0.1), accumulation_steps=0)


def test_cosine_schedule_warms_up_then_decays_to_the_floor():
    from asrkit.training.schedules import WarmupCosine

    schedule = WarmupCosine(peak=2.0, warmup=10, total=110, final_ratio=0.1)

    # The schedule sees optimizer.iterations (updates done); update number = iterations + 1.
    def lr(update):
        return float(schedule(update - 1))

    assert lr(5) == pytest.approx(2.0 * 5 / 10)
    assert lr(10) == pytest.approx(2.0)
    halfway = 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * 0.5))
    assert lr(60) == pytest.approx(2.0 * halfway, rel=1e-6)
    assert lr(110) == pytest.approx(0.2, rel=1e-6)
    assert lr(500) == pytest.approx(0.2, rel=1e-6)


def _numpy_window_loss(model, batches):
    """Σ tokens·err² / Σ tokens over every batch, computed in NumPy from the weights."""
    (k1, b1), (k2, b2) = [(layer.kernel.numpy(), layer.bias.numpy()) for layer in model.layers]
    total = count = 0.0
    for x, y, tokens in batches:
        pred = (np.tanh(x.astype(np.float64) @ k1 + b1) @ k2 + b2)[:, 0]
        total += float(np.sum(tokens * np.square(pred - y)))
        count += float(np.sum(tokens))
    return total / count


@pytest.mark.parametrize("distributed", [False, True])
def test_evaluate_reports_the_count_normalised_loss(mirrored, distributed):
    batches = make_batches([4, 3, 5, 1, 4], seed=5)
    strategy = mirrored if distributed else tf.distribute.get_strategy()
    with strategy.scope():
        optimizer = keras.optimizers.SGD(0.1)
    model, _, _ = train(batches, optimizer, steps=2, strategy=strategy)
    want = _numpy_window_loss(model, batches)
    assert want > 0.1
    result = model.evaluate(make_dataset(batches), verbose=0, return_dict=True)
    assert result["loss"] == pytest.approx(want, rel=1e-5)
    assert [m.name for m in model.metrics].count("loss") == 1


def test_fit_validation_loss_equals_a_separate_evaluate():
    train_batches, val_batches = make_batches(SIZES, seed=1), make_batches([3, 4, 2], seed=9)
    keras.utils.set_random_seed(1)
    model = TokenRegressor()
    model.compile(keras.optimizers.SGD(0.1), accumulation_steps=3)
    model.build_engine(train_batches[0])
    history = model.fit(
        make_dataset(train_batches), validation_data=make_dataset(val_batches), verbose=0
    )
    want = _numpy_window_loss(model, val_batches)
    assert history.history["val_loss"][0] == pytest.approx(want, rel=1e-5)
    separate = model.evaluate(make_dataset(val_batches), verbose=0, return_dict=True)["loss"]
    assert separate == pytest.approx(want, rel=1e-5)
