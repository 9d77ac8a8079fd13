"""Batched greedy search for TDT (token-and-duration transducer) models, in graph mode.

A TDT joint predicts, from one (frame, predictor state), a symbol and a duration. At frame
t the best symbol k and the best duration d are taken: a blank moves to frame t + d (a
blank of duration 0 counts as 1); a token is emitted at frame t, the predictor advances,
and the search moves to t + d (d = 0: another symbol at the same frame). After
`max_symbols_per_step` tokens at one frame with duration 0, the search moves on by one
frame. These are the decisions of NeMo's greedy TDT search (its label-looping batched
search), so an imported NeMo TDT model finds the tokens NeMo finds. Rows are independent;
uses the model's `encode`, `predictor.step` and `joint.tokens_and_durations`.
"""

from __future__ import annotations

import tensorflow as tf

from asrkit.config import DecodeConfig
from asrkit.decoding.found import Found
from asrkit.decoding.greedy import advance_where, record_emissions
from asrkit.tokenizer import BLANK_ID

SYMBOLS = DecodeConfig.max_symbols_per_step


def tdt_greedy_search(model, encoded, encoder_lengths, max_symbols_per_step: int = SYMBOLS):
    """encoded [B, T, D] -> `Found` (tokens, frames, token log-probs [B, T·S], counts [B],
    scores [B]: the sum of the chosen symbols' and durations' log-probs)."""
    predictor, joint = model.predictor, model.joint
    durations = tf.constant(list(model.config.durations), tf.int32)
    batch, frames = tf.shape(encoded)[0], tf.shape(encoded)[1]
    lengths = tf.cast(encoder_lengths, tf.int32)
    capacity = frames * max_symbols_per_step
    pred_out, state = predictor.step(tf.fill([batch], BLANK_ID), predictor.initial_state(batch))

    def cond(t, *_):
        return tf.reduce_any(t < lengths)

    def body(t, pred_out, state, run, last, tokens, token_frames, log_ps, counts, scores):
        active = t < lengths
        frame = tf.gather(encoded, tf.minimum(t, frames - 1), axis=1, batch_dims=1)
        token_logits, duration_logits = joint.tokens_and_durations(frame, pred_out)
        log_probs = tf.nn.log_softmax(tf.cast(token_logits, tf.float32))
        duration_log_probs = tf.nn.log_softmax(tf.cast(duration_logits, tf.float32))
        best = tf.argmax(log_probs, axis=-1, output_type=tf.int32)
        best_log_prob = tf.reduce_max(log_probs, axis=-1)
        skip = tf.gather(durations, tf.argmax(duration_log_probs, axis=-1, output_type=tf.int32))
        scores += tf.where(active, best_log_prob + tf.reduce_max(duration_log_probs, -1), 0.0)
        emit = active & (best != BLANK_ID)
        skip = tf.where((best == BLANK_ID) & (skip == 0), 1, skip)
        tokens, token_frames, log_ps, counts = record_emissions(
            emit, best, t, best_log_prob, tokens, token_frames, log_ps, counts
        )
        run = tf.where(emit, tf.where(last == t, run + 1, 1), run)
        last = tf.where(emit, t, last)
        pred_out, state = advance_where(predictor, emit, best, pred_out, state)
        forced = emit & (skip == 0) & (run >= max_symbols_per_step)
        t = tf.where(active, t + skip + tf.cast(forced, tf.int32), t)
        return t, pred_out, state, run, last, tokens, token_frames, log_ps, counts, scores

    start = [
        tf.zeros([batch], tf.int32), pred_out, state, tf.zeros([batch], tf.int32),
        tf.fill([batch], -1), tf.fill([batch, capacity], -1), tf.fill([batch, capacity], -1),
        tf.zeros([batch, capacity], tf.float32), tf.zeros([batch], tf.int32),
        tf.zeros([batch], tf.float32),
    ]  # fmt: skip
    result = tf.while_loop(cond, body, start)
    return Found(*result[5:])
