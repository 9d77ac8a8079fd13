"""The fusion tables inside a search (graph mode): where each hypothesis's automata start,
what every token earns from their states, the states after a step, and what ending earns.
The tables themselves are built in `asrkit.decoding.fusion.tables`."""

from __future__ import annotations

import tensorflow as tf

from asrkit.decoding.fusion.tables import FusionTables


def as_tensors(tables: FusionTables) -> FusionTables:
    return FusionTables(*(tf.convert_to_tensor(x) for x in tables))


def start_states(tables: FusionTables, shape) -> tf.Tensor:
    """Every hypothesis of `shape` ([B] or [B, K]) at the automata's start: [*shape, A]."""
    start = tf.convert_to_tensor(tables.start, tf.int32)
    return tf.broadcast_to(start, tf.concat([shape, tf.shape(start)], axis=0))


def step_scores(tables: FusionTables, where) -> tf.Tensor:
    """States [..., A] -> what each token earns from them, summed over automata [..., V]."""
    return tf.reduce_sum(tf.gather(tables.bonus, where), axis=-2)


def advanced(tables: FusionTables, where, symbol, emit) -> tf.Tensor:
    """States [..., A] after `symbol` [...] where `emit` [...], as they were elsewhere
    (`symbol` may be negative where nothing is emitted)."""
    token = tf.broadcast_to(tf.maximum(symbol, 0)[..., None], tf.shape(where))
    stepped = tf.gather_nd(tables.next_state, tf.stack([where, token], axis=-1))
    return tf.where(emit[..., None], stepped, where)


def final_scores(tables: FusionTables, where) -> tf.Tensor:
    """States [..., A] -> what ending there earns, summed over automata [...]."""
    return tf.reduce_sum(tf.gather(tables.final, where), axis=-1)
