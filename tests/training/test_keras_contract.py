"""The Keras behaviour asrkit's engine relies on. A failure here means Keras changed: update
`asrkit/training/keras_hooks.py`, where every private hook is listed."""

import contextlib
import gc
import weakref

import keras
import numpy as np
import pytest
import tensorflow as tf

from asrkit.training.accumulation import AccumulatingModel, WindowMean
from asrkit.training.keras_hooks import (
    SYMBOLIC_BUILD,
)
from asrkit.training.keras_hooks import (
    gradients_already_reduced as _gradients_already_reduced,
)
from tests.training.toy import TokenRegressor, make_batches, make_dataset


def _apply_known_gradient(strategy, hook):
    with strategy.scope():
        var = keras.Variable(np.zeros(3, np.float32))
        optimizer = keras.optimizers.SGD(1.0)
        optimizer.build([var])

    @tf.function(autograph=False)
    def step():
        def replica_fn():
            optimizer.apply([tf.constant([1.0, 2.0, 3.0])], [var])

        if hook:
            with strategy.scope(), _gradients_already_reduced(optimizer):
                strategy.run(replica_fn)
        else:
            with strategy.scope():
                strategy.run(replica_fn)

    step()
    return var.numpy()


def test_replica_context_apply_all_reduces_unless_hooked(mirrored):
    strategy = mirrored
    # Keras sums the gradient over the 2 replicas itself: an already-reduced gradient
    # would count twice. With the hook it counts once.
    np.testing.assert_array_equal(_apply_known_gradient(strategy, hook=False), [-2, -4, -6])
    np.testing.assert_array_equal(_apply_known_gradient(strategy, hook=True), [-1, -2, -3])


def test_hook_is_removed_after_use():
    optimizer = keras.optimizers.SGD(1.0)
    with _gradients_already_reduced(optimizer):
        assert optimizer._all_reduce_sum_gradients is list
    assert optimizer._all_reduce_sum_gradients.__func__ is type(optimizer)._all_reduce_sum_gradients


def test_fit_calls_the_symbolic_build_we_override(monkeypatch):
    """Keras' own version reduces the first distributed batch with MEAN and fails on odd
    global batches; ours replaces it. If Keras renamed it or stopped calling it, ours
    would silently stop applying: fit() and evaluate() must call it by that name."""
    assert SYMBOLIC_BUILD in vars(AccumulatingModel)
    calls = []
    ours = getattr(AccumulatingModel, SYMBOLIC_BUILD)

    def spy(self, *args, **kwargs):
        calls.append(type(self).__name__)
        return ours(self, *args, **kwargs)

    monkeypatch.setattr(AccumulatingModel, SYMBOLIC_BUILD, spy)
    batches = make_batches([3, 2])
    model = TokenRegressor()
    model.compile(keras.optimizers.SGD(0.1), accumulation_steps=2)
    model.fit(make_dataset(batches), verbose=0)
    assert calls, f"keras.Model.fit no longer calls {SYMBOLIC_BUILD}"
    before = len(calls)
    model.evaluate(make_dataset(batches), verbose=0)
    assert len(calls) > before, f"keras.Model.evaluate no longer calls {SYMBOLIC_BUILD}"


def test_compile_installs_the_loss_tracker_we_replace():
    # Keras' compile sets a private `_loss_tracker` (a Mean) that `metrics` lists first;
    # asrkit swaps in its Σ loss / Σ count metric right after.
    plain = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    plain.compile("sgd", loss="mse")
    assert isinstance(plain._loss_tracker, keras.metrics.Mean)
    assert plain.metrics[0] is plain._loss_tracker
    ours = TokenRegressor()
    ours.compile(keras.optimizers.SGD(0.1))
    assert isinstance(ours._loss_tracker, WindowMean)
    assert [m.name for m in ours.metrics] == ["loss"]


def test_variable_index_finds_each_weights_slot(mirrored):
    """Inside a distributed update_step the weight arrives as the strategy's per-device
    value; the private index still finds its position in the build list."""
    from asrkit.training.keras_hooks import variable_index

    with mirrored.scope():
        variables = [keras.Variable(np.zeros(s, np.float32)) for s in [(2,), (3, 2), (4,)]]
        optimizer = keras.optimizers.SGD(1.0)
        optimizer.build(variables)
    found = []

    def record(gradient, variable, learning_rate):
        index = variable_index(optimizer, variable)
        found.append((index, tuple(variable.shape) == variables[index].shape))

    optimizer.update_step = record

    @tf.function(autograph=False)
    def step():
        mirrored.run(lambda: optimizer.apply([tf.ones(v.shape) for v in variables], variables))

    step()
    assert sorted(set(found)) == [(0, True), (1, True), (2, True)]


@pytest.mark.parametrize("distributed", [False, True], ids=["default", "mirrored"])
def test_fit_and_evaluate_free_their_dataset_iterators_without_the_collector(
    distributed, mirrored, monkeypatch
):
    """Keras' epoch iterator holds the dataset iterator in a reference cycle; left to the
    garbage collector, its threads would be joined inside whatever code runs next. Every
    dataset iterator fit() and evaluate() open must be gone when they return, with the
    collector off."""
    from tensorflow.python.data.ops import iterator_ops

    opened = []
    init = iterator_ops.OwnedIterator.__init__

    def tracked(self, *args, **kwargs):
        init(self, *args, **kwargs)
        opened.append(weakref.ref(self))

    monkeypatch.setattr(iterator_ops.OwnedIterator, "__init__", tracked)
    scope = mirrored.scope() if distributed else contextlib.nullcontext()
    batches = make_batches([4, 2, 4, 6])
    with scope:
        model = TokenRegressor()
        model.compile(keras.optimizers.SGD(0.1), accumulation_steps=2)
    model.build_engine(batches[0])
    gc.collect()
    gc.disable()
    try:
        for call in (model.fit, model.evaluate):
            before = len(opened)
            for unknown_length in (False, True):
                call(make_dataset(batches, unknown_length=unknown_length), verbose=0)
            assert len(opened) > before, f"{call.__name__} opened no dataset iterator"
            alive = [ref for ref in opened if ref() is not None]
            assert not alive, f"{len(alive)} dataset iterator(s) left after {call.__name__}"
    finally:
        gc.enable()
