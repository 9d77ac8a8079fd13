"""A tiny AccumulatingModel and an independent large-batch reference for the engine tests."""

from __future__ import annotations

import functools

import keras
import numpy as np
import tensorflow as tf

from asrkit.training import AccumulatingModel

FEATURES = 4


class TokenRegressor(AccumulatingModel):
    """Each item has a weight ("tokens"); loss_sum = Σ tokens·err², count = Σ tokens."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.hidden = keras.layers.Dense(8, activation="tanh")
        self.out = keras.layers.Dense(1)

    def call(self, x, training=False):
        return self.out(self.hidden(x))[:, 0]

    def compute_loss_terms(self, data, training=True):
        x, y, tokens = data
        err = tf.cast(self(x, training=training), tf.float32) - y
        tokens = tf.cast(tokens, tf.float32)
        return tf.reduce_sum(tokens * tf.square(err)), tf.reduce_sum(tokens)


def make_batches(sizes, seed=0, zero_tokens=()):
    rng = np.random.default_rng(seed)
    batches = []
    for i, n in enumerate(sizes):
        x = rng.standard_normal((n, FEATURES)).astype(np.float32)
        y = rng.standard_normal(n).astype(np.float32)
        tokens = rng.integers(1, 6, size=n).astype(np.float32)
        if i in zero_tokens:
            tokens[:] = 0
        batches.append((x, y, tokens))
    return batches


def make_dataset(batches, unknown_length=False):
    """One dataset element per micro-batch, each `.batch()`ed so strategies can split it."""
    parts = [tf.data.Dataset.from_tensor_slices(b).batch(len(b[0])) for b in batches]
    dataset = functools.reduce(lambda a, b: a.concatenate(b), parts)
    if unknown_length:
        dataset = dataset.filter(lambda *_: True)
    return dataset


def weights(model):
    return [v.numpy().copy() for v in model.trainable_variables]


def reference_run(initial, windows, optimizer, clip=None, skip=(), losses=None):
    """Applies `optimizer` once per window to d(Σ loss / Σ count)/dw of the window's union.

    If `losses` is a list, (loss_sum, count) of every applied window is appended to it."""
    model = TokenRegressor()
    model.compute_loss_terms(windows[0][0], training=False)
    for var, value in zip(model.trainable_variables, initial, strict=True):
        var.assign(value)
    for k, window in enumerate(windows):
        if k in skip:
            continue
        union = tuple(np.concatenate([b[i] for b in window]) for i in range(3))
        with tf.GradientTape() as tape:
            loss_sum, count = model.compute_loss_terms(union)
            loss = loss_sum / count
        grads = tape.gradient(loss, model.trainable_variables)
        if losses is not None:
            losses.append((float(loss_sum), float(count)))
        if clip is not None:
            grads, _ = tf.clip_by_global_norm(grads, clip)
        optimizer.apply(grads, model.trainable_variables)
    optimizer.finalize_variable_values(model.trainable_variables)  # as fit() does (EMA)
    return weights(model), optimizer


def windows_of(batches, steps):
    return [batches[i : i + steps] for i in range(0, len(batches), steps)]


def assert_weights_close(got, want, rtol=1e-5, atol=1e-6):
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(g, w, rtol=rtol, atol=atol)
