"""Batched beam search for TDT (token-and-duration transducer) models, in graph mode.

A modified ALSD search, the kind NeMo's batched TDT beam search (malsd_batch) runs: each of
the K hypotheses of an utterance sits at its own encoder frame. At every step each
hypothesis that has not reached the end is extended by every (symbol, duration) pair —
log P(symbol) + log P(duration) from the joint at its frame — while finished hypotheses
compete unchanged; the K best survive. A blank moves the hypothesis `duration` frames on
(a blank of duration 0 moves one, as in greedy search); a token is appended at the frame
and moves `duration` frames on, and after `max_symbols_per_step` tokens of duration 0 at
one frame the hypothesis moves one frame on. These are the decisions of
`tdt_greedy_search`, so beam 1 *is* greedy search, and a beam wide enough to keep every
candidate sums each token sequence over all its paths exactly (both tested).

Hypotheses in one search state — equal token sequences at the same frame, with the same
count of tokens already emitted there — are merged: their probabilities add (log-sum-exp)
into the best of them. Hypotheses at different frames compete with one another, as in
NeMo's search. Uses the model's `predictor.step` and `joint.tokens_and_durations`.
"""

from __future__ import annotations

import tensorflow as tf

from asrkit.config import DecodeConfig
from asrkit.decoding.fusion.steps import advanced, step_scores
from asrkit.decoding.search.beam import (
    DEAD_SCORE,
    beam_found,
    beam_start,
    extend,
    merge_equal,
    same_shapes,
    taken_back,
    with_room,
)
from asrkit.decoding.search.greedy import fusion_start
from asrkit.tokenizer import BLANK_ID

SYMBOLS = DecodeConfig.max_symbols_per_step


def tdt_beam_search(
    model, encoded, encoder_lengths, beam: int = 4, max_symbols_per_step: int = SYMBOLS,
    boost=None,
):  # fmt: skip
    """encoded [B, T, D] -> `Found` with a K axis, best first (see `beam_search`); a score
    is the log-probability of the hypothesis: its (symbol, duration) decisions, summed over
    the paths merged into it, plus (with `boost` tables) its word-boosting bonus."""
    k = int(beam)
    batch, num_frames = tf.shape(encoded)[0], tf.shape(encoded)[1]
    durations = tf.constant(list(model.config.durations), tf.int32)
    num_durations = len(model.config.durations)
    lengths = tf.cast(encoder_lengths, tf.int32)[:, None]  # [B, 1]
    beams = with_room(beam_start(model, batch, k), num_frames * int(max_symbols_per_step))
    slot = tf.range(k)
    time = tf.zeros([batch, k], tf.int32)  # each hypothesis's frame
    run = tf.zeros([batch, k], tf.int32)  # tokens it emitted at that frame

    def active(beams, time):
        return (time < lengths) & (beams.scores > DEAD_SCORE / 2)

    def cond(beams, time, run, where):
        return tf.reduce_any(active(beams, time))

    def body(beams, time, run, where):
        live = active(beams, time)
        at = tf.clip_by_value(time, 0, tf.maximum(num_frames - 1, 0))
        frame = tf.reshape(tf.gather(encoded, at, batch_dims=1), [batch * k, -1])
        token_logits, duration_logits = model.joint.tokens_and_durations(frame, beams.pred_out)
        log_probs = tf.reshape(tf.nn.log_softmax(tf.cast(token_logits, tf.float32)), [batch, k, -1])
        duration_log_probs = tf.reshape(
            tf.nn.log_softmax(tf.cast(duration_logits, tf.float32)), [batch, k, num_durations]
        )
        ranked = log_probs if boost is None else log_probs + step_scores(boost, where)
        pairs = ranked[..., None] + duration_log_probs[:, :, None, :]  # [B, K, V, D]
        pairs = tf.reshape(pairs, [batch, k, -1])
        # each hypothesis's K best pairs hold the K best extensions of the whole beam
        best_pairs, pair = tf.math.top_k(pairs, k=tf.minimum(k, tf.shape(pairs)[-1]))
        extended = tf.where(live[..., None], beams.scores[..., None] + best_pairs, DEAD_SCORE)
        stay = tf.where(live, DEAD_SCORE, beams.scores)[..., None]
        candidates = tf.concat([stay, extended], axis=2)  # column 0: stay, 1 + j: pair j
        width = tf.shape(candidates)[2]
        top_scores, top = tf.math.top_k(tf.reshape(candidates, [batch, -1]), k=k)
        parent, column = top // width, top % width
        moved = column > 0
        chosen = tf.gather(pair, parent, batch_dims=1)  # [B, K, pairs]
        chosen = tf.gather(chosen, tf.maximum(column - 1, 0), batch_dims=2)
        symbol = tf.where(moved, chosen // num_durations, -1)
        duration = tf.where(moved, tf.gather(durations, chosen % num_durations), 0)
        emit = moved & (symbol != BLANK_ID)
        symbol_log_prob = tf.gather(
            tf.gather(log_probs, parent, batch_dims=1), tf.maximum(symbol, 0), batch_dims=2
        )
        time_p = tf.gather(time, parent, batch_dims=1)
        run_p = tf.gather(run, parent, batch_dims=1)
        stays_here = emit & (duration == 0)
        forced = stays_here & (run_p + 1 >= max_symbols_per_step)
        step = tf.where(moved & ~emit, tf.maximum(duration, 1), duration)
        new_time = tf.minimum(time_p + step + tf.cast(forced, tf.int32), lengths)
        new_run = tf.where(stays_here & ~forced, run_p + 1, tf.where(moved, 0, run_p))

        new = extend(model, beams, parent, symbol, emit, time_p, symbol_log_prob)
        keys = [new.hashes, new.counts, new_time, new_run]
        new = new._replace(scores=merge_equal(top_scores, keys, slot))
        new_time = tf.ensure_shape(new_time, time.shape)
        new_run = tf.ensure_shape(new_run, run.shape)
        if boost is not None:  # equal sequences are in one automaton state
            kept = tf.gather(where, parent, batch_dims=1)
            where = tf.ensure_shape(advanced(boost, kept, symbol, emit), where.shape)
        return same_shapes(new, beams), new_time, new_run, where

    where = fusion_start(boost, [batch, k])  # each hypothesis's automata states
    beams, _, _, where = tf.while_loop(cond, body, [beams, time, run, where])
    return beam_found(beams if boost is None else taken_back(beams, boost, where))
