"""Every private Keras hook asrkit relies on, in one place (Keras is pinned to 3.15.*).

Each is guarded by a contract test in `tests/training/test_keras_contract.py` that fails
loudly when a Keras release changes it:

1. `gradients_already_reduced(optimizer)` — sets the TF optimizer's private
   `_all_reduce_sum_gradients` to the identity while the engine applies a window
   gradient that is already all-reduced (applied in replica context, Keras would sum it
   over replicas a second time). Test: `test_replica_context_apply_all_reduces_unless_hooked`.
2. `install_loss_tracker(model, metric)` — replaces the private `_loss_tracker` that
   `Trainer.compile` installs (a plain `Mean`) with asrkit's Σ loss / Σ count metric, so
   `evaluate()` and `val_loss` report the loss the updates use. Test:
   `test_compile_installs_the_loss_tracker_we_replace`.
3. `SYMBOLIC_BUILD` — `AccumulatingModel` overrides Keras' private
   `_maybe_symbolic_build`, which would reduce the first distributed batch with MEAN
   (failing on odd global batches). Test: `test_fit_calls_the_symbolic_build_we_override`.
4. Checkpoint names (`asrkit.checkpoints.named_variables`) walk a layer's attributes and
   pass over Keras' and TensorFlow's bookkeeping ones (`_layers`, `_tracker`,
   `_self_*`, ...). Test: `test_names_are_attribute_paths_the_same_in_every_instance`
   (every variable named, none through bookkeeping).
5. `variable_index(optimizer, variable)` — the private `_get_variable_index` by which a
   Keras optimizer finds a weight's own slots inside `update_step` (the weight arrives
   there as the strategy's per-device value); `FactoredAdafactor` keeps its factored
   slots in lists indexed by it. Test: `test_variable_index_finds_each_weights_slot`.
6. `release_epoch_iterator(epoch_iterator)` — the epoch iterator that `fit`/`evaluate`
   pass to `_maybe_symbolic_build` keeps the dataset iterator in a generator that refers
   back to it: a reference cycle, so after `fit` returns the tf.data iterator (its
   background threads, its prefetched batches) would live until a full garbage
   collection, which then waits for those threads wherever it happens to run. Its
   `reset()` drops the generator and the iterator. Test:
   `test_fit_and_evaluate_free_their_dataset_iterators_without_the_collector`.
"""

from __future__ import annotations

import contextlib

import keras

SYMBOLIC_BUILD = "_maybe_symbolic_build"
_VARIABLE_INDEX = "_get_variable_index"
_LOSS_TRACKER = "_loss_tracker"


@contextlib.contextmanager
def gradients_already_reduced(optimizer):
    """Stops a Keras TF optimizer from all-reducing gradients that are already reduced.

    Applied in replica context (Keras' normal path: it reaches the variables through
    merge_call and `strategy.extended.update`), Keras' TF optimizer first sums the
    gradients over replicas with `_all_reduce_sum_gradients`; the window gradient is
    already that sum, so the hook becomes the identity while the update is traced.
    """
    if not hasattr(type(optimizer), "_all_reduce_sum_gradients"):
        raise RuntimeError(
            f"{type(optimizer).__name__} has no _all_reduce_sum_gradients: this Keras version "
            "changed the optimizer's distribution path; asrkit's accumulation needs updating."
        )
    optimizer._all_reduce_sum_gradients = list
    try:
        yield
    finally:
        del optimizer._all_reduce_sum_gradients


def install_loss_tracker(model: keras.Model, metric: keras.metrics.Metric) -> None:
    """Makes `metric` the model's loss tracker (the first entry of `model.metrics`).

    Set without Keras' attribute tracking, like the `Mean` it replaces: a metric, not a
    model variable (it stays out of `model.variables` and checkpoints)."""
    if not hasattr(model, _LOSS_TRACKER):
        raise RuntimeError(
            "keras.Model has no _loss_tracker: this Keras version changed compile(); "
            "asrkit's evaluate() loss needs updating."
        )
    object.__setattr__(model, _LOSS_TRACKER, metric)


def release_epoch_iterator(epoch_iterator) -> None:
    """Drops the dataset iterator a Keras epoch iterator holds (see item 6 above)."""
    reset = getattr(epoch_iterator, "reset", None)
    if reset is None:
        raise RuntimeError(
            f"{type(epoch_iterator).__name__} has no reset(): this Keras version changed "
            "its epoch iterator; asrkit's AccumulatingModel.fit needs updating."
        )
    reset()


def variable_index(optimizer, variable) -> int:
    """The position of `variable` in the list `optimizer.build` was given."""
    find = getattr(optimizer, _VARIABLE_INDEX, None)
    if find is None:
        raise RuntimeError(
            "keras.optimizers.Optimizer has no _get_variable_index: this Keras version "
            "changed how update_step finds a weight's slots; asrkit's Adafactor needs updating."
        )
    return find(variable)
