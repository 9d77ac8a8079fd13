"""Batched greedy search for TDT (token-and-duration transducer) models, in graph mode.

A TDT joint predicts, from one (frame, predictor state), a symbol and a duration. At frame
t the best symbol k and the best duration d are taken: a blank moves to frame t + d (a
blank of duration 0 counts as 1); a token is emitted at frame t, the predictor advances,
and the search moves to t + d (d = 0: another symbol at the same frame). After
`max_symbols_per_step` tokens at one frame with duration 0, the search moves on by one
frame. These are the decisions of NeMo's greedy TDT search (its label-looping batched
search), so an imported NeMo TDT model finds the tokens NeMo finds. Rows are independent;
uses the model's `encode`, `predictor.step` and the joint's projections, activation, output
and duration layers. The search takes its decisions a window of frames at a time
(`tdt_greedy_continue`).
"""

from __future__ import annotations

import tensorflow as tf

from asrkit.config import DecodeConfig
from asrkit.decoding.fusion.steps import advanced
from asrkit.decoding.search.found import Found
from asrkit.decoding.search.greedy import (
    best_symbols,
    emit_and_advance,
    fusion_start,
    window_hidden,
)
from asrkit.tokenizer import BLANK_ID

SYMBOLS = DecodeConfig.max_symbols_per_step
# frames a step looks ahead: a TDT blank already jumps by its duration (NeMo's models: up to
# 4 frames), so a shorter window than RNN-T's pays (RESULTS.md, the window sweep)
WINDOW = 4


def tdt_greedy_search(
    model, encoded, encoder_lengths, max_symbols_per_step: int = SYMBOLS, window: int = WINDOW,
    boost=None,
):  # fmt: skip
    """encoded [B, T, D] -> `Found` (tokens, frames, token log-probs [B, T·S], counts [B],
    scores [B]: the sum of the chosen symbols' and durations' log-probs). With `boost`
    (`FusionTables` as tensors) each symbol is the one whose log-prob plus the automata's
    score is highest; log-probs and scores stay the model's."""
    carry = tdt_greedy_start(model, tf.shape(encoded)[0])
    found, _ = tdt_greedy_continue(
        model, encoded, encoder_lengths, carry, max_symbols_per_step, window=window, boost=boost
    )
    return found


def tdt_greedy_start(model, batch):
    """The search's carry before any frame: (predictor output, predictor state) after
    blank, and the frame each row goes on from (0)."""
    predictor = model.predictor
    pred_out, state = predictor.step(tf.fill([batch], BLANK_ID), predictor.initial_state(batch))
    return pred_out, state, tf.zeros([batch], tf.int32)


def tdt_greedy_continue(
    model, encoded, encoder_lengths, carry, max_symbols_per_step: int = SYMBOLS, first_frame=0,
    window: int = WINDOW, boost=None,
):  # fmt: skip
    """The search over `encoded` from a carry (`tdt_greedy_start`, or what an earlier call
    on the frames before returned) -> (`Found`, the carry after these frames). A row whose
    last duration jumps past these frames goes on that many frames into the next call's,
    so a stream decoded piece by piece finds what one call on the whole utterance finds;
    token frames count from `first_frame` (scores are per call).

    The decisions are taken `window` frames at a time: a blank leaves the predictor as it
    is, so each row joins its predictor state with its next `window` frames at once and
    follows its blanks' jumps through them (by pointer doubling: log2(window) gathers) to
    the first frame it reaches whose best symbol is not blank, or past the window. The
    encoder's half of the joint is projected once for all frames. With `boost` the carry
    also holds each row's automata states ([B, A], a fourth element; their start when it
    has none), and the carry returned holds it too."""
    joint = model.joint
    durations = tf.constant(list(model.config.durations), tf.int32)
    reach = window + max(max(model.config.durations), 1)  # positions a jump can land on
    batch, frames = tf.shape(encoded)[0], tf.shape(encoded)[1]
    lengths = tf.cast(encoder_lengths, tf.int32)
    capacity = frames * max_symbols_per_step
    projected = joint.encoder_proj(encoded)  # [B, T, D]
    offsets = tf.range(window)
    pred_out, state, start = carry[:3]
    start_where = carry[3] if len(carry) > 3 else fusion_start(boost, [batch])

    def cond(t, *_):
        return tf.reduce_any(t < lengths)

    def body(t, pred_out, state, pred_proj, run, last, tokens, token_frames, log_ps, counts,
             scores, where):  # fmt: skip
        valid, hidden = window_hidden(joint, projected, pred_proj, t, window, lengths)
        log_probs = tf.nn.log_softmax(tf.cast(joint.output_layer(hidden), tf.float32))
        duration_log_probs = tf.nn.log_softmax(tf.cast(joint.duration_layer(hidden), tf.float32))
        best, best_log_prob = best_symbols(log_probs, boost, where)  # [B, W]
        skip = tf.gather(durations, tf.argmax(duration_log_probs, -1, output_type=tf.int32))
        step_score = best_log_prob + tf.reduce_max(duration_log_probs, -1)
        # Where each window position's decision leads: a blank jumps (at least one frame),
        # anything else stops there; positions past the window (up to `reach`) stop too.
        jumps = valid & (best == BLANK_ID)
        stops = tf.range(reach)[None, :] + tf.zeros_like(t)[:, None]  # [B, R]
        pad = [[0, 0], [0, reach - window]]
        after = tf.where(jumps, offsets + tf.maximum(skip, 1), offsets)
        after = tf.where(tf.pad(jumps, pad), tf.pad(after, pad), stops)
        gained = tf.pad(tf.where(jumps, step_score, 0.0), pad)
        for _ in range(max(1, (window - 1).bit_length())):  # 2^k jumps >= window positions
            gained += tf.gather(gained, after, batch_dims=1)
            after = tf.gather(after, after, batch_dims=1)
        reached, blanks_score = after[:, 0], gained[:, 0]
        here = tf.minimum(reached, window - 1)[:, None]
        emit = (reached < window) & tf.gather(valid, here, batch_dims=1)[:, 0]
        symbol = tf.gather(best, here, batch_dims=1)[:, 0]
        symbol_skip = tf.gather(skip, here, batch_dims=1)[:, 0]
        symbol_score = tf.gather(step_score, here, batch_dims=1)[:, 0]
        symbol_log_prob = tf.gather(best_log_prob, here, batch_dims=1)[:, 0]
        scores += blanks_score + tf.where(emit, symbol_score, 0.0)
        frame = t + reached
        (tokens, token_frames, log_ps, counts), (pred_out, state, pred_proj) = emit_and_advance(
            model, emit, symbol, frame + first_frame, symbol_log_prob,
            (tokens, token_frames, log_ps, counts), (pred_out, state, pred_proj),
        )  # fmt: skip
        if boost is not None:
            where = advanced(boost, where, symbol, emit)
        run = tf.where(emit, tf.where(last == frame, run + 1, 1), run)
        last = tf.where(emit, frame, last)
        forced = emit & (symbol_skip == 0) & (run >= max_symbols_per_step)
        after_emit = frame + symbol_skip + tf.cast(forced, tf.int32)
        t = tf.where(t < lengths, tf.where(emit, after_emit, frame), t)
        return (t, pred_out, state, pred_proj, run, last, tokens, token_frames, log_ps, counts,
                scores, where)  # fmt: skip

    loop = [
        start, pred_out, state, joint.predictor_proj(pred_out), tf.zeros([batch], tf.int32),
        tf.fill([batch], -1), tf.fill([batch, capacity], -1), tf.fill([batch, capacity], -1),
        tf.zeros([batch, capacity], tf.float32), tf.zeros([batch], tf.int32),
        tf.zeros([batch], tf.float32), start_where,
    ]  # fmt: skip
    result = tf.while_loop(cond, body, loop)
    # a row leaves these frames once it is past them: it goes on in the next call's frames
    boosted = (result[11],) if boost is not None else ()
    return Found(*result[6:11]), (result[1], result[2], tf.maximum(result[0] - lengths, 0),
                                  *boosted)  # fmt: skip
