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
from asrkit.decoding.greedy import emit_and_advance
from asrkit.tokenizer import BLANK_ID

SYMBOLS = DecodeConfig.max_symbols_per_step


def tdt_greedy_search(model, encoded, encoder_lengths, max_symbols_per_step: int = SYMBOLS):
    """encoded [B, T, D] -> `Found` (tokens, frames, token log-probs [B, T·S], counts [B],
    scores [B]: the sum of the chosen symbols' and durations' log-probs)."""
    carry = tdt_greedy_start(model, tf.shape(encoded)[0])
    found, _ = tdt_greedy_continue(model, encoded, encoder_lengths, carry, max_symbols_per_step)
    return found


def tdt_greedy_start(model, batch):
    """The search's carry before any frame: (predictor output, predictor state) after
    blank, and the frame each row goes on from (0)."""
    predictor = model.predictor
    pred_out, state = predictor.step(tf.fill([batch], BLANK_ID), predictor.initial_state(batch))
    return pred_out, state, tf.zeros([batch], tf.int32)


def tdt_greedy_continue(
    model, encoded, encoder_lengths, carry, max_symbols_per_step: int = SYMBOLS, first_frame=0
):
    """The search over `encoded` from a carry (`tdt_greedy_start`, or what an earlier call
    on the frames before returned) -> (`Found`, the carry after these frames). A row whose
    last duration jumps past these frames goes on that many frames into the next call's,
    so a stream decoded piece by piece finds what one call on the whole utterance finds;
    token frames count from `first_frame` (scores are per call)."""
    predictor, joint = model.predictor, model.joint
    durations = tf.constant(list(model.config.durations), tf.int32)
    batch, frames = tf.shape(encoded)[0], tf.shape(encoded)[1]
    lengths = tf.cast(encoder_lengths, tf.int32)
    capacity = frames * max_symbols_per_step
    pred_out, state, start = carry

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
        (tokens, token_frames, log_ps, counts), (pred_out, state) = emit_and_advance(
            predictor, emit, best, t + first_frame, best_log_prob,
            (tokens, token_frames, log_ps, counts), (pred_out, state),
        )  # fmt: skip
        run = tf.where(emit, tf.where(last == t, run + 1, 1), run)
        last = tf.where(emit, t, last)
        forced = emit & (skip == 0) & (run >= max_symbols_per_step)
        t = tf.where(active, t + skip + tf.cast(forced, tf.int32), t)
        return t, pred_out, state, run, last, tokens, token_frames, log_ps, counts, scores

    loop = [
        start, pred_out, state, tf.zeros([batch], tf.int32),
        tf.fill([batch], -1), tf.fill([batch, capacity], -1), tf.fill([batch, capacity], -1),
        tf.zeros([batch, capacity], tf.float32), tf.zeros([batch], tf.int32),
        tf.zeros([batch], tf.float32),
    ]  # fmt: skip
    result = tf.while_loop(cond, body, loop)
    # a row leaves these frames once it is past them: it goes on in the next call's frames
    return Found(*result[5:]), (result[1], result[2], tf.maximum(result[0] - lengths, 0))
