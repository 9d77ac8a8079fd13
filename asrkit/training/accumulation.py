"""The accumulation engine: one `fit` step = one optimizer update from N micro-batches.

Owns `AccumulatingModel`. A subclass implements `compute_loss_terms(data, training)` and
returns (sum of per-item losses, number of items) for one micro-batch on one replica.
One call of the train function ("a window") then:

1. runs up to N micro-steps, each in replica context: forward + backward of `loss_sum`
   (under float16 loss scaling: of `loss_scale · loss_sum / local_count`, unscaled again
   in float32), added to replica-local float32 accumulators (no collective, no optimizer
   call, no branch around a sync point); a replica whose share of the micro-batch is
   empty adds exactly nothing (its terms are selected away, whatever the kernels
   returned for an empty batch);
2. all-reduces the accumulated gradients, loss sums and counts once (a single batched
   all-reduce), divides by the window's *total* count over all micro-batches and
   replicas, checks finiteness and clips by global norm — all on identical,
   already-reduced values, so every replica reaches the same decision;
3. on that decision, either applies the optimizer once (iterations, schedules, weight
   decay and EMA advance once) or skips the whole window (nothing in the optimizer
   moves; the loss scale halves if the gradient overflowed).

The decision is taken in Python between two compiled functions, on values identical on
every replica and worker, so no control flow ever surrounds a cross-replica sync point.
A loss whose terms are divided by different counts (a hybrid's transducer loss by the
window's tokens, its CTC loss by its utterances: `uses_window_counts`) needs those counts
before the window's first backward pass: the window's micro-batches are then drawn first
(their inputs only), their counts totalled over them and every replica (one small
all-reduce each), and every micro-step is handed the totals.
On one device without a strategy, a window of one micro-batch needs no accumulators: the
compiled call that computes its gradient and statistics hands the gradient back, and the
update call takes it.
The optimizer is applied in replica context with the already-reduced gradient, and Keras
is kept from all-reducing it a second time. The private Keras hooks this needs are all in
`asrkit.training.keras_hooks`.
"""

from __future__ import annotations

import contextlib
import warnings
from dataclasses import dataclass
from functools import partial
from typing import NamedTuple

import keras
import tensorflow as tf

from asrkit.training.keras_hooks import (
    gradients_already_reduced,
    install_loss_tracker,
    release_epoch_iterator,
)
from asrkit.training.loss_scale import LossScaleSettings, unwrap_optimizer


@dataclass(frozen=True)
class AccumulationSettings:
    steps: int
    clip_global_norm: float | None
    max_consecutive_skips: int
    jit_compile: bool
    loss_scale: LossScaleSettings


class _EngineState:
    """Variables the engine needs; a plain object so Keras does not track the accumulators
    as model weights (they are zero at every window boundary, so never worth saving)."""

    def __init__(
        self, model: keras.Model, optimizer, settings: AccumulationSettings, accumulate: bool
    ):
        variables = model.trainable_variables if accumulate else []
        with model.distribute_strategy.scope():
            self.grads = [
                tf.Variable(
                    tf.zeros(v.shape, tf.float32),
                    trainable=False,
                    synchronization=tf.VariableSynchronization.ON_READ,
                    aggregation=tf.VariableAggregation.SUM,
                    name=f"accum/{v.path}".replace(":", "_"),
                )
                for v in variables
            ]
            self.loss_sum, self.count = (
                tf.Variable(
                    0.0,
                    trainable=False,
                    synchronization=tf.VariableSynchronization.ON_READ,
                    aggregation=tf.VariableAggregation.SUM,
                    name=name,
                )
                for name in ("accum/loss_sum", "accum/count")
            )
            # A zero Grappler cannot fold (see `_clear_accumulators`).
            self.zero = tf.Variable(0.0, trainable=False, name="accum/zero")
            # Running totals of the current epoch (cross-replica, identical everywhere).
            self.epoch_loss_sum = tf.Variable(0.0, trainable=False, name="epoch_loss_sum")
            self.epoch_count = tf.Variable(0.0, trainable=False, name="epoch_count")
            # Saved with the optimizer so a restored run continues exactly.
            scale = settings.loss_scale.initial_scale if settings.loss_scale.enabled else 1.0
            self.loss_scale = optimizer.add_variable(
                (), initializer=keras.initializers.Constant(scale), name="asrkit_loss_scale"
            )
            self.growth = optimizer.add_variable((), dtype="int64", name="asrkit_scale_growth")
            self.skipped = optimizer.add_variable((), dtype="int64", name="asrkit_skipped")
            self.consecutive = optimizer.add_variable(
                (), dtype="int64", name="asrkit_consecutive_skips"
            )


class _WindowStats(NamedTuple):
    """What one window's accumulation returns; identical on every replica and worker."""

    loss_sum: tf.Tensor  # Σ item losses over the window, all replicas
    count: tf.Tensor  # Σ items over the window, all replicas
    grad_norm: tf.Tensor  # global norm of the window gradient, before clipping
    finite: tf.Tensor
    ok: tf.Tensor  # finite and count > 0: apply the update


class AccumulatingModel(keras.Model):
    """A keras.Model whose `fit` makes exact accumulated updates.

    Subclasses implement `compute_loss_terms`. Each dataset element is one global
    micro-batch (the strategy splits it across replicas, as Keras does). Keras'
    `steps_per_execution` is set to the accumulation steps, so the progress bar and
    `steps_per_epoch` count micro-batches, and callbacks run at window boundaries only.
    """

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._engine = None
        self._single = False  # see `_single_micro_batches`
        # The epoch iterators of the fit/evaluate calls running now (a plain list, out of
        # Keras' attribute tracking), released as each call returns.
        object.__setattr__(self, "_epoch_iterators", [])

    def compute_loss_terms(self, data, training: bool = True) -> tuple[tf.Tensor, tf.Tensor]:
        """Forward pass on one micro-batch shard: (scalar sum of item losses, item count).
        With `uses_window_counts`, also called with `window_counts=`: the totals of
        `window_counts` over the whole window."""
        raise NotImplementedError(f"{type(self).__name__} must implement compute_loss_terms")

    # A loss that needs counts of the whole window before any of its micro-batches is
    # differentiated (e.g. two terms divided by two different counts) says so here, and
    # `window_counts(data)` gives one micro-batch shard's [K] float32 counts: the engine
    # then draws the window's micro-batches first (their inputs only), totals the counts
    # over them and every replica, and hands the totals to each micro-step.
    uses_window_counts = False

    def window_counts(self, data) -> tf.Tensor:
        raise NotImplementedError(f"{type(self).__name__} must implement window_counts")

    # ----------------------------------------------------------------------------- compile
    def compile(
        self,
        optimizer="adamw",
        *,
        accumulation_steps: int = 1,
        clip_global_norm: float | None = None,
        max_consecutive_skips: int = 25,
        jit_compile: bool = False,
        run_eagerly: bool = False,
    ) -> None:
        if int(accumulation_steps) < 1:
            raise ValueError(f"accumulation_steps must be >= 1, got {accumulation_steps}")
        if clip_global_norm is not None and not clip_global_norm > 0:
            raise ValueError(f"clip_global_norm must be > 0 or None, got {clip_global_norm}")
        optimizer = keras.optimizers.get(optimizer)
        # The model's own policy (fixed when it was built), not whatever the global one is now.
        inner, loss_scale = unwrap_optimizer(optimizer, self.dtype_policy.name)
        self._accumulation = AccumulationSettings(
            steps=int(accumulation_steps),
            clip_global_norm=None if clip_global_norm is None else float(clip_global_norm),
            max_consecutive_skips=int(max_consecutive_skips),
            jit_compile=bool(jit_compile),
            loss_scale=loss_scale,
        )
        self._engine = None  # rebuilt for the new optimizer on the next fit()
        super().compile(
            optimizer=inner,
            steps_per_execution=int(accumulation_steps),
            jit_compile=False,
            run_eagerly=run_eagerly,
            auto_scale_loss=False,
        )
        # Keras' compile installs a plain Mean as the loss tracker; evaluate() needs
        # Σ loss_sum / Σ count (the normaliser the updates use).
        install_loss_tracker(self, WindowMean(name="loss"))

    @property
    def accumulation(self) -> AccumulationSettings:
        return self._accumulation

    @property
    def loss_scale(self) -> float:
        return float(self._engine.loss_scale.numpy()) if self._engine else 1.0

    # ------------------------------------------------------------------------------- build
    def build_engine(self, example_batch) -> None:
        """Builds the model from one micro-batch, then optimizer slots and accumulators."""
        if self._engine is not None:
            return
        if not hasattr(self, "_accumulation"):
            raise RuntimeError("AccumulatingModel: call compile() before fit()")
        with self.distribute_strategy.scope():
            if not self.built:
                self.compute_loss_terms(example_batch, training=False)
                self.built = True
            self.optimizer.build(self.trainable_variables)
            self._single = _single_micro_batches(self)
            self._engine = _EngineState(
                self, self.optimizer, self._accumulation, accumulate=not self._single
            )

    def _maybe_symbolic_build(self, iterator=None, data_batch=None):
        # Keras' version draws the first distributed batch and reduces it with MEAN across
        # replicas, which fails for odd global batch sizes. `fit`/`evaluate` here build from
        # a real batch before Keras gets there, so there is nothing left to do but note
        # the epoch iterator, to release it when the call returns.
        if iterator is not None:
            self._epoch_iterators.append(iterator)
        if self._engine is None and not self.built:
            raise RuntimeError("AccumulatingModel: model not built; call fit() or build_engine()")

    def fit(self, x=None, y=None, **kwargs):
        if y is not None:
            raise ValueError(
                "AccumulatingModel.fit takes a dataset of micro-batches; y must be None"
            )
        if self._engine is None:
            self.build_engine(_first_element(x))
        kwargs.setdefault("shuffle", False)  # a dataset is shuffled by its own pipeline
        with warnings.catch_warnings():
            # Keras warns at the end of every epoch of a dataset of unknown length; here
            # that is the normal way an epoch ends.
            warnings.filterwarnings("ignore", message="Your input ran out of data")
            with self._releasing_epoch_iterators():
                return super().fit(x, **kwargs)

    def evaluate(self, x=None, y=None, **kwargs):
        if y is not None:
            raise ValueError("AccumulatingModel.evaluate takes a dataset; y must be None")
        if not self.built:
            self.build_engine(_first_element(x))
        with self._releasing_epoch_iterators():
            return super().evaluate(x, **kwargs)

    @contextlib.contextmanager
    def _releasing_epoch_iterators(self):
        """Frees the dataset iterators of one fit/evaluate call when it returns or raises,
        so their threads and prefetched batches do not wait for the garbage collector."""
        opened = len(self._epoch_iterators)
        try:
            yield
        finally:
            while len(self._epoch_iterators) > opened:
                release_epoch_iterator(self._epoch_iterators.pop())

    def reset_metrics(self):
        super().reset_metrics()
        if self._engine is not None:
            self._engine.epoch_loss_sum.assign(0.0)
            self._engine.epoch_count.assign(0.0)

    # ---------------------------------------------------------------------------- evaluate
    @tf.autograph.experimental.do_not_convert  # Keras traces it; see make_train_function
    def test_step(self, data):
        loss_sum, count = self.compute_loss_terms(data, training=False)
        self._loss_tracker.update_state(loss_sum, count)
        return {"loss": self._loss_tracker.result()}

    def train_step(self, data):
        raise NotImplementedError(
            "AccumulatingModel trains through fit() on a dataset; train_on_batch is not supported"
        )

    # ------------------------------------------------------------------------------- train
    def make_train_function(self, force: bool = False):
        if self.train_function is not None and not force:
            return self.train_function
        # The engine, the task and the losses are written in TensorFlow ops and loops
        # (no Python control flow on tensors), so AutoGraph has nothing to convert: left on,
        # it would re-parse their source at every trace.
        wrap = (lambda f: f) if self.run_eagerly else partial(tf.function, autograph=False)
        reduce, apply, skip = (
            wrap(self._reduce_function),
            wrap(self._apply_window),
            wrap(self._skip_window),
        )
        apply_gradient = wrap(self._apply_gradient)
        steps, limit = self._accumulation.steps, self._accumulation.max_consecutive_skips
        taking = []  # [element spec, micro-step function, gradient function] of the dataset

        def functions_for(iterator):
            """The functions that take a micro-batch, traced once for the dataset's element
            spec (its padded dimensions unknown: one trace for every batch shape)."""
            spec = iterator.element_spec
            if not taking or taking[0] != spec:
                take = wrap if self.run_eagerly else partial(wrap, input_signature=[spec])
                totals = tf.TensorSpec([None], tf.float32)
                with_totals = (
                    wrap if self.run_eagerly else partial(wrap, input_signature=[spec, totals])
                )
                taking[:] = [
                    spec, take(self._micro_function), take(self._single_gradient),
                    take(self._window_counts), with_totals(self._counted_micro_function),
                ]  # fmt: skip
            return taking[1:]

        def next_micro_batch(iterator):
            # Drawn here, outside the compiled step: the end of the data is then an eager
            # StopIteration. Inside the step's graph TensorFlow formats that error from the
            # whole graph's debug information (0.3-0.8 s at 114 M parameters, every epoch).
            try:
                return next(iterator)
            except (tf.errors.OutOfRangeError, StopIteration):
                return None

        def window(iterator) -> _WindowStats:
            consumed = (
                counted_window(iterator) if self.uses_window_counts else plain_window(iterator)
            )
            if consumed == 0:
                raise StopIteration
            stats = reduce()
            # The decision is taken here, between compiled functions, on values that are
            # identical on every replica and worker: a tf.cond around the optimizer inside
            # the distributed graph is exactly what raises merge_call errors.
            if bool(stats.ok):
                apply(stats.loss_sum, stats.count)
            else:
                skip(stats.finite)
            return stats

        def plain_window(iterator) -> int:
            """Up to `steps` micro-steps, each micro-batch drawn as it is needed."""
            micro = functions_for(iterator)[0]
            consumed = 0
            while consumed < steps:
                data = next_micro_batch(iterator)
                if data is None:
                    break  # end of the epoch's data: a partial window keeps its own total
                micro(data)
                del data
                consumed += 1
            return consumed

        def counted_window(iterator) -> int:
            """The window's micro-batches drawn first (inputs only), their counts totalled
            over them and every replica, then each micro-step with the totals."""
            _, _, counts, micro = functions_for(iterator)
            drawn = []
            while len(drawn) < steps:
                data = next_micro_batch(iterator)
                if data is None:
                    break  # end of the epoch's data: a partial window keeps its own totals
                drawn.append(data)
            if drawn:
                totals = tf.add_n([counts(data) for data in drawn])
                for data in drawn:
                    micro(data, totals)
            return len(drawn)

        def single_window(iterator) -> _WindowStats:
            data = next_micro_batch(iterator)
            if data is None:
                raise StopIteration
            grads, stats = functions_for(iterator)[1](data)
            del data
            stats = _WindowStats(*stats)
            if bool(stats.ok):
                apply_gradient(grads, stats.loss_sum, stats.count)
            else:
                skip(stats.finite)
            del grads  # the gradient lives from one call to the next, no longer
            return stats

        def train_function(iterator):
            if not isinstance(iterator, (tf.data.Iterator, tf.distribute.DistributedIterator)):
                raise TypeError("AccumulatingModel trains from a dataset iterator (use fit)")
            stats = single_window(iterator) if self._single else window(iterator)
            consecutive = int(self._engine.consecutive.numpy())
            if consecutive > limit:
                raise RuntimeError(
                    f"AccumulatingModel: {consecutive} consecutive windows were skipped "
                    f"(non-finite gradient or no items; limit {limit}). Check the data and the "
                    "learning rate, or raise compile(max_consecutive_skips=...)."
                )
            return self._window_logs(stats)

        self.train_function = train_function
        return train_function

    def _micro_function(self, data) -> None:
        """One micro-step on a global micro-batch (per replica under a strategy).

        Each micro-step is its own call: no loop in the graph can keep two micro-batches'
        activations alive at once, and the graph stays the size of one step.
        """
        micro_step = self._micro_step
        if self._accumulation.jit_compile:
            micro_step = _per_replica_compiled(micro_step)
        self.distribute_strategy.run(micro_step, args=(data,))

    def _window_counts(self, data) -> tf.Tensor:
        """`window_counts` of a global micro-batch, summed over every replica (and worker)."""
        strategy = self.distribute_strategy
        local = strategy.run(self.window_counts, args=(data,))
        return strategy.reduce(tf.distribute.ReduceOp.SUM, local, axis=None)

    def _counted_micro_function(self, data, totals) -> None:
        """`_micro_function` with the window's count totals."""
        micro_step = self._micro_step
        if self._accumulation.jit_compile:
            micro_step = _per_replica_compiled(micro_step)
        self.distribute_strategy.run(micro_step, args=(data, totals))

    def _reduce_function(self) -> _WindowStats:
        """The window's single all-reduce; returns replica 0's (identical) statistics."""
        strategy = self.distribute_strategy
        reduced = strategy.run(self._reduce_window)
        return _WindowStats(*(strategy.experimental_local_results(v)[0] for v in reduced))

    def _micro_step(self, data, totals=None):
        """Replica context: accumulate d(loss_scale · loss_sum)/dw; no collective, no branch.
        `totals`: the window's count totals (`uses_window_counts`)."""
        engine = self._engine
        grads, loss_sum, count = self._gradient(data, totals=totals)
        # A replica's share of a micro-batch smaller than the replica count is empty. Some
        # kernels (TensorFlow's CPU depthwise-convolution filter gradient among them) then
        # return their output buffer unwritten: finite garbage that no finiteness check
        # catches. An empty share contributes exactly nothing, whatever the kernels did: its
        # terms are selected away (not multiplied by 0: the garbage may be inf or NaN).
        # Against a scalar 0, not `zeros_like(grad)`: Grappler folds that into a constant of
        # the gradient's shape, and the graph would hold a weights-sized set of zeros.
        present = share_is_present(data)
        for acc, grad in zip(engine.grads, grads, strict=True):
            if grad is not None:
                acc.assign_add(tf.where(present, grad, 0.0))
        engine.loss_sum.assign_add(tf.where(present, loss_sum, 0.0))
        engine.count.assign_add(tf.where(present, count, 0.0))

    def _gradient(self, data, per_item: bool = False, totals=None):
        """Replica context: (float32 d loss_sum / dw per trainable variable, None where a
        variable has none; loss_sum; count) of one micro-batch share. `per_item`: the
        gradient of loss_sum / count instead (0 for no items), the division taken on the
        scalar loss before the backward pass rather than on every gradient after it."""
        engine = self._engine
        variables = self.trainable_variables
        with tf.GradientTape() as tape:
            if totals is None:
                loss_sum, count = self.compute_loss_terms(data, training=True)
            else:
                loss_sum, count = self.compute_loss_terms(data, training=True,
                                                          window_counts=totals)  # fmt: skip
            loss_sum = tf.cast(loss_sum, tf.float32)
            count = tf.cast(count, tf.float32)
            if self._accumulation.loss_scale.enabled:
                # Differentiate scale · (local mean), the range float16 loss scaling is made
                # for; a sum over many items would overflow far more often. Undone in float32
                # below, so the gradients are plain sums (or means) either way.
                scale = engine.loss_scale.value
                target = loss_sum * (scale / tf.maximum(count, 1.0))
                unscale = 1.0 / scale if per_item else tf.maximum(count, 1.0) / scale
            else:
                unscale = None
                target = tf.math.divide_no_nan(loss_sum, count) if per_item else loss_sum
        grads = []
        for grad in tape.gradient(target, variables):
            if grad is not None:
                grad = tf.cast(tf.convert_to_tensor(grad), tf.float32)
                grad = grad if unscale is None else grad * unscale
            grads.append(grad)
        return grads, loss_sum, count

    def _reduce_window(self):
        """Replica context: one all-reduce, then identical maths on every replica.

        Leaves the final window gradient (/ total count, clipped) in the
        accumulators for `_apply_window`, and returns (loss_sum, count, grad_norm, finite, ok).
        """
        engine = self._engine
        local = [acc.read_value() for acc in engine.grads]
        local += [engine.loss_sum.read_value(), engine.count.read_value()]
        summed = tf.distribute.get_replica_context().all_reduce(tf.distribute.ReduceOp.SUM, local)
        grads, stats = self._window_statistics(summed[:-2], summed[-2], summed[-1])
        for acc, grad in zip(engine.grads, grads, strict=True):
            acc.assign(grad)
        engine.loss_sum.assign(0.0)
        engine.count.assign(0.0)
        return stats

    def _window_statistics(self, sums, loss_sum, count, per_item: bool = False):
        """From the window's gradient sums, loss sum and item count (over all its
        micro-batches and replicas): (the gradient to apply: sums / count, clipped by global
        norm; _WindowStats). `per_item`: `sums` are already divided by the count.

        One pass over the gradient for its norm, one to scale it (by 1 / count and the clip
        together), none when neither is needed: at 0.6 B parameters each pass is 2.3 GiB
        read (and written). The norm is also the finiteness check: a NaN or an infinity
        anywhere makes the sum of squares NaN or infinite. (So does a finite value beyond
        ~1.8e19, whose square overflows float32: such a window is skipped as an overflow.)
        """
        norm = tf.linalg.global_norm(sums)
        finite = tf.logical_and(tf.math.is_finite(norm), tf.math.is_finite(loss_sum))
        scale = None if per_item else tf.math.divide_no_nan(1.0, count)
        grad_norm = norm if scale is None else norm * scale
        clip = self._accumulation.clip_global_norm
        if clip is not None:
            # tf.clip_by_global_norm's factor: 1 unless the norm is above the clip
            factor = clip / tf.maximum(grad_norm, clip)
            scale = factor if scale is None else scale * factor
        grads = list(sums) if scale is None else [g * scale for g in sums]
        return grads, _WindowStats(
            loss_sum, count, grad_norm, finite, tf.logical_and(finite, count > 0)
        )

    def _apply_window(self, loss_sum, count):
        """One optimizer update from the reduced window gradient left in the accumulators."""
        strategy = self.distribute_strategy
        with strategy.scope(), gradients_already_reduced(self.optimizer):
            strategy.run(self._apply_replica)
            self._count_update(loss_sum, count)

    def _count_update(self, loss_sum, count) -> None:
        """The engine's bookkeeping of an applied window."""
        engine = self._engine
        engine.consecutive.assign(0)
        engine.epoch_loss_sum.assign_add(loss_sum)
        engine.epoch_count.assign_add(count)
        if self._accumulation.loss_scale.enabled:
            grown = engine.growth + 1 >= self._accumulation.loss_scale.growth_steps
            scale = tf.where(grown, engine.loss_scale * 2.0, engine.loss_scale)
            engine.loss_scale.assign(scale)
            engine.growth.assign(tf.where(grown, tf.constant(0, tf.int64), engine.growth + 1))

    def _apply_replica(self):
        grads = [acc.read_value() for acc in self._engine.grads]
        self.optimizer.apply(grads, self.trainable_variables)
        self._clear_accumulators()

    def _skip_window(self, finite):
        """Nothing in the optimizer moves; the window is dropped whole, on every replica."""
        strategy = self.distribute_strategy
        with strategy.scope():
            strategy.run(self._clear_accumulators)
            self._count_skip(finite)

    def _count_skip(self, finite) -> None:
        """The engine's bookkeeping of a skipped window (the loss scale halves on overflow)."""
        engine = self._engine
        engine.skipped.assign_add(1)
        engine.consecutive.assign_add(1)
        if self._accumulation.loss_scale.enabled:
            overflow = tf.logical_not(finite)
            halved = tf.maximum(engine.loss_scale * 0.5, 1.0)
            engine.loss_scale.assign(tf.where(overflow, halved, engine.loss_scale))
            engine.growth.assign(tf.where(overflow, tf.constant(0, tf.int64), engine.growth))

    def _single_gradient(self, data):
        """A window of one micro-batch on one device: (its gradient to apply, as a list of
        tensors handed back to the caller; its _WindowStats). See `_single_micro_batches`."""
        grads, loss_sum, count = self._gradient(data, per_item=True)
        # A variable the loss does not reach gets a zero gradient, as its (zero) accumulator
        # would give it.
        grads = [
            tf.zeros(v.shape, tf.float32) if g is None else g
            for g, v in zip(grads, self.trainable_variables, strict=True)
        ]
        grads, stats = self._window_statistics(grads, loss_sum, count, per_item=True)
        # An empty micro-batch is skipped as having no items, whatever its kernels returned,
        # never as an overflow.
        finite = tf.logical_or(stats.finite, tf.logical_not(share_is_present(data)))
        return grads, tuple(stats._replace(finite=finite))

    def _apply_gradient(self, grads, loss_sum, count):
        """One optimizer update from a gradient `_single_gradient` handed back."""
        self.optimizer.apply(grads, self.trainable_variables)
        self._count_update(loss_sum, count)

    def _clear_accumulators(self):
        # Each accumulator is filled with a zero read at run time, one after another. Not
        # `zeros_like(acc)` for all at once: that held a second weights-sized set of zeros
        # at the window's end (0.6 B: the step's allocator peak 3.1-4.4 GiB against 1.5-1.8
        # with this), and a zero known when the graph is built can be folded by Grappler
        # into constants the graph keeps. In sequence, so only one accumulator's fill at a
        # time is alive beside the state (an assign takes over a buffer nobody else holds).
        done = []
        for acc in self._engine.grads:
            with tf.control_dependencies(done):
                zeros = tf.fill(tf.shape(acc), self._engine.zero.read_value())
                done = [acc.assign(zeros, read_value=False)]

    def _window_logs(self, stats: _WindowStats) -> dict:
        engine = self._engine
        epoch_count = float(engine.epoch_count.numpy())
        logs = {
            "loss": float(engine.epoch_loss_sum.numpy()) / epoch_count if epoch_count else 0.0,
            "window_loss": float(stats.loss_sum) / float(stats.count) if stats.count else 0.0,
            "grad_norm": float(stats.grad_norm),
            "skipped_windows": int(engine.skipped.numpy()),
            "learning_rate": float(tf.convert_to_tensor(self.optimizer.learning_rate)),
        }
        if self._accumulation.loss_scale.enabled:
            logs["loss_scale"] = float(engine.loss_scale.numpy())
        return logs


def _single_micro_batches(model: AccumulatingModel) -> bool:
    """Windows of one micro-batch on one device without a strategy (nor XLA, which compiles
    the micro-step alone) need no accumulators: the compiled gradient call hands the
    window's gradient back to Python, which decides and passes it to the update call. Under
    a strategy the gradient is per replica, and stays in the replicas' accumulators."""
    settings = model.accumulation
    if settings.steps != 1 or settings.jit_compile:
        return False
    with model.distribute_strategy.scope():
        return not tf.distribute.has_strategy()


def share_is_present(data) -> tf.Tensor:
    """Scalar bool: does this micro-batch share hold any item (its first tensor's leading
    dimension, the batch, is > 0)."""
    first = tf.nest.flatten(data)[0]
    return tf.shape(first)[0] > 0


def _per_replica_compiled(fn):
    """`fn` XLA-compiled once per replica, each compilation bound to its own replica.

    A traced function captures the variable handles it touches. Under MirroredStrategy a
    replica reads its own component of every variable, so one compiled function shared by
    all replicas would hold replica 0's handles and be asked, from replica 1's device, to
    update them — XLA refuses a resource on another device. One `tf.function` per replica
    id means each is traced inside its own replica and captures only that replica's
    variables (one compile per replica device, the same as XLA needs anyway).
    """
    compiled: dict[int, tf.types.experimental.GenericFunction] = {}

    def run(*args):
        replica = tf.get_static_value(tf.distribute.get_replica_context().replica_id_in_sync_group)
        if replica is None:
            raise RuntimeError("jit_compile: the replica id is not known while tracing")
        if int(replica) not in compiled:
            # Traced per input shape (XLA compiles per shape anyway): static shapes let
            # size arguments, such as the fused loss's chunk count, be compile-time constants.
            compiled[int(replica)] = tf.function(fn, jit_compile=True, autograph=False)
        return compiled[int(replica)](*args)

    return run


def _first_element(data):
    if isinstance(data, tf.data.Dataset):
        return next(iter(data))
    if isinstance(data, tf.distribute.DistributedDataset):
        raise ValueError(
            "AccumulatingModel.fit: pass the tf.data.Dataset itself; the model distributes it"
        )
    raise TypeError(
        "AccumulatingModel.fit expects a tf.data.Dataset whose elements are micro-batches, "
        f"got {type(data).__name__}"
    )


@keras.saving.register_keras_serializable(package="asrkit")
class WindowMean(keras.metrics.Metric):
    """Σ loss / Σ count over everything seen (the same normaliser the updates use)."""

    def __init__(self, name: str = "loss", **kwargs):
        super().__init__(name=name, **kwargs)
        self.total = self.add_variable((), initializer="zeros", aggregation="sum", name="total")
        self.count = self.add_variable((), initializer="zeros", aggregation="sum", name="count")

    def update_state(self, loss_sum, count):
        self.total.assign_add(tf.cast(loss_sum, tf.float32))
        self.count.assign_add(tf.cast(count, tf.float32))

    def result(self):
        return tf.math.divide_no_nan(self.total, self.count)
