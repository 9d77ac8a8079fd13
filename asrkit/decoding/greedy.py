"""Batched greedy transducer decoding in graph mode.

At each encoder frame the joint is evaluated on the current predictor state; while the
best symbol is not blank (and at most `max_symbols_per_step` times per frame) it is emitted
and the predictor advances. Rows are independent: a row past its `encoder_lengths` emits
nothing, and per-row `tf.where` keeps the others' predictor states untouched. Uses only
the model's `encode`, `predictor.step` and `join`.
"""

from __future__ import annotations

import tensorflow as tf

from asrkit.config import DecodeConfig
from asrkit.decoding.found import Found
from asrkit.tokenizer import BLANK_ID

SYMBOLS = DecodeConfig.max_symbols_per_step  # the config's default, defined there once


def greedy_search(model, encoded, encoder_lengths, max_symbols_per_step: int = SYMBOLS):
    """encoded [B, T, D] -> `Found` with tokens/frames/token_log_probs [B, T·S], counts [B],
    scores [B].

    Token slots past counts[b] hold -1 (log-probs 0). A token's log-prob is the joint's
    log-posterior of that symbol where it was emitted. Runs as a tf.while_loop over frames
    with an inner loop over symbols, so it compiles into one graph.
    """
    start = greedy_start(model, tf.shape(encoded)[0])
    found, _ = greedy_continue(model, encoded, encoder_lengths, start, max_symbols_per_step)
    return found


def greedy_start(model, batch):
    """The search's carry before any frame: (predictor output, predictor state) after blank."""
    predictor = model.predictor
    return predictor.step(tf.fill([batch], BLANK_ID), predictor.initial_state(batch))


def greedy_continue(
    model, encoded, encoder_lengths, carry, max_symbols_per_step: int = SYMBOLS, first_frame=0
):
    """Greedy search over `encoded` from a carry (`greedy_start`, or what an earlier call on
    the frames before returned) -> (`Found`, the carry after these frames). Token frames
    count from `first_frame`, so a stream decoded piece by piece finds what one call on
    the whole utterance finds (scores are per call)."""
    batch, frames = tf.shape(encoded)[0], tf.shape(encoded)[1]
    capacity = frames * max_symbols_per_step
    predictor = model.predictor
    pred_out, state = carry
    tokens = tf.fill([batch, capacity], -1)
    token_frames = tf.fill([batch, capacity], -1)
    token_log_probs = tf.zeros([batch, capacity], tf.float32)
    counts = tf.zeros([batch], tf.int32)
    scores = tf.zeros([batch], tf.float32)

    def frame_body(t, pred_out, state, tokens, token_frames, token_log_probs, counts, scores):
        frame = encoded[:, t, :]
        active = t < encoder_lengths

        def symbol_cond(s, active, *_):
            return tf.logical_and(s < max_symbols_per_step, tf.reduce_any(active))

        def symbol_body(s, active, pred_out, state, tokens, token_frames, log_ps, counts, scores):
            log_probs = tf.nn.log_softmax(tf.cast(model.join(frame, pred_out), tf.float32))
            best = tf.argmax(log_probs, axis=-1, output_type=tf.int32)
            best_log_prob = tf.reduce_max(log_probs, axis=-1)
            scores += tf.where(active, best_log_prob, 0.0)
            emit = tf.logical_and(active, best != BLANK_ID)
            (tokens, token_frames, log_ps, counts), (pred_out, state) = emit_and_advance(
                predictor, emit, best, tf.zeros_like(counts) + (t + first_frame), best_log_prob,
                (tokens, token_frames, log_ps, counts), (pred_out, state),
            )  # fmt: skip
            return s + 1, emit, pred_out, state, tokens, token_frames, log_ps, counts, scores

        loop = tf.while_loop(
            symbol_cond,
            symbol_body,
            [0, active, pred_out, state, tokens, token_frames, token_log_probs, counts, scores],
        )
        return (t + 1, *loop[2:])

    result = tf.while_loop(
        lambda t, *_: t < frames,
        frame_body,
        [0, pred_out, state, tokens, token_frames, token_log_probs, counts, scores],
    )
    return Found(*result[3:]), (result[1], result[2])


def emit_and_advance(predictor, emit, best, frames, best_log_prob, found, carry):
    """`record_emissions` and `advance_where`, run only when some row emits: a step where
    every row emits blank (most steps, and every one of a single utterance's blank frames)
    leaves `found` (tokens, token_frames, log_ps, counts) and `carry` (pred_out, state)
    as they are without the scatters or a predictor step."""

    def emitted():
        recorded = record_emissions(emit, best, frames, best_log_prob, *found)
        return recorded, advance_where(predictor, emit, best, *carry)

    return tf.cond(tf.reduce_any(emit), emitted, lambda: (found, carry))


def record_emissions(emit, best, frames, best_log_prob, tokens, token_frames, log_ps, counts):
    """Writes each emitting row's token, frame [B] and log-prob into its next slot."""
    capacity = tf.shape(tokens)[1]
    rows = tf.range(tf.shape(tokens)[0])
    slots = tf.boolean_mask(tf.stack([rows, tf.minimum(counts, capacity - 1)], axis=1), emit)
    tokens = tf.tensor_scatter_nd_update(tokens, slots, tf.boolean_mask(best, emit))
    token_frames = tf.tensor_scatter_nd_update(token_frames, slots, tf.boolean_mask(frames, emit))
    log_ps = tf.tensor_scatter_nd_update(log_ps, slots, tf.boolean_mask(best_log_prob, emit))
    return tokens, token_frames, log_ps, counts + tf.cast(emit, tf.int32)


def advance_where(predictor, emit, best, pred_out, state):
    """The predictor advanced by `best` in the emitting rows, as it was in the others."""
    new_out, new_state = predictor.step(tf.where(emit, best, BLANK_ID), state)
    keep = emit[:, None]
    pred_out = tf.where(keep, new_out, pred_out)
    state = tf.nest.map_structure(lambda new, old: tf.where(keep, new, old), new_state, state)
    return pred_out, state
