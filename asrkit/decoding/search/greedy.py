"""Batched greedy transducer decoding in graph mode.

At each encoder frame the joint is evaluated on the current predictor state; while the
best symbol is not blank (and at most `max_symbols_per_step` times per frame) it is emitted
and the predictor advances. The search takes these decisions a window of frames at a time
(`greedy_continue`). Rows are independent: a row past its `encoder_lengths` emits nothing,
and per-row `tf.where` keeps the others' predictor states untouched. Uses the model's
`encode`, `predictor.step` and the joint's projections, activation and output layer.
"""

from __future__ import annotations

import tensorflow as tf

from asrkit.config import DecodeConfig
from asrkit.decoding.fusion.steps import advanced, start_states, step_scores
from asrkit.decoding.search.found import Found
from asrkit.tokenizer import BLANK_ID

SYMBOLS = DecodeConfig.max_symbols_per_step  # the config's default, defined there once
WINDOW = 8  # frames a greedy step looks ahead for the next non-blank symbol


def greedy_search(
    model, encoded, encoder_lengths, max_symbols_per_step: int = SYMBOLS, window: int = WINDOW,
    boost=None,
):  # fmt: skip
    """encoded [B, T, D] -> `Found` with tokens/frames/token_log_probs [B, T·S], counts [B],
    scores [B].

    Token slots past counts[b] hold -1 (log-probs 0). A token's log-prob is the joint's
    log-posterior of that symbol where it was emitted. Runs as one tf.while_loop whose
    steps each look `window` frames ahead (`greedy_continue`), so it compiles into one
    graph. With `boost` (`FusionTables` as tensors: word boosting, LM fusion) each decision
    takes the symbol whose log-prob plus the automata's score is highest; log-probs and
    scores stay the model's.
    """
    start = greedy_start(model, tf.shape(encoded)[0])
    found, _ = greedy_continue(
        model, encoded, encoder_lengths, start, max_symbols_per_step, window=window, boost=boost
    )
    return found


def greedy_start(model, batch):
    """The search's carry before any frame: (predictor output, predictor state) after blank."""
    predictor = model.predictor
    return predictor.step(tf.fill([batch], BLANK_ID), predictor.initial_state(batch))


def greedy_continue(
    model, encoded, encoder_lengths, carry, max_symbols_per_step: int = SYMBOLS, first_frame=0,
    window: int = WINDOW, boost=None,
):  # fmt: skip
    """Greedy search over `encoded` from a carry (`greedy_start`, or what an earlier call on
    the frames before returned) -> (`Found`, the carry after these frames). Token frames
    count from `first_frame`, so a stream decoded piece by piece finds what one call on
    the whole utterance finds (scores are per call).

    The decisions are those of the frame-by-frame loop (at each frame, symbols until blank
    or `max_symbols_per_step` of them), taken `window` frames at a time: each row joins
    its current predictor state with its next `window` frames at once, emits blank up to
    the first frame whose best symbol is not blank, emits that symbol and advances its
    predictor. A run of blank frames thus costs one step per `window` frames, not one per
    frame. The encoder's half of the joint is projected once for all frames.

    With `boost` the carry also holds each row's automata states ([B, A], a third
    element; their start when it has none), and the carry returned holds it too."""
    batch, frames = tf.shape(encoded)[0], tf.shape(encoded)[1]
    capacity = frames * max_symbols_per_step
    joint = model.joint
    lengths = tf.cast(encoder_lengths, tf.int32)
    projected = joint.encoder_proj(encoded)  # [B, T, D]
    offsets = tf.range(window)
    pred_out, state = carry[:2]
    start_where = carry[2] if len(carry) > 2 else fusion_start(boost, [batch])
    loop = [
        tf.zeros([batch], tf.int32), tf.zeros([batch], tf.int32), pred_out, state,
        joint.predictor_proj(pred_out), tf.fill([batch, capacity], -1),
        tf.fill([batch, capacity], -1), tf.zeros([batch, capacity], tf.float32),
        tf.zeros([batch], tf.int32), tf.zeros([batch], tf.float32),
        start_where,  # each row's automata states (with `boost`)
    ]  # fmt: skip

    def body(t, run, pred_out, state, pred_proj, tokens, token_frames, log_ps, counts, scores,
             where):  # fmt: skip
        # t: each row's next frame; run: symbols it has emitted at frame t already
        active = t < lengths
        valid, hidden = window_hidden(joint, projected, pred_proj, t, window, lengths)
        log_probs = tf.nn.log_softmax(tf.cast(joint.output_layer(hidden), tf.float32))
        best, best_log_prob = best_symbols(log_probs, boost, where)  # [B, W]
        # the first frame of the window whose best symbol is not blank (window: none)
        first = tf.reduce_min(tf.where(valid & (best != BLANK_ID), offsets, window), axis=1)
        emit = first < window
        blanks = valid & (offsets < first[:, None])
        at_first = tf.minimum(first, window - 1)[:, None]
        symbol = tf.gather(best, at_first, batch_dims=1)[:, 0]
        symbol_log_prob = tf.gather(best_log_prob, at_first, batch_dims=1)[:, 0]
        scores += tf.reduce_sum(tf.where(blanks, best_log_prob, 0.0), axis=1)
        scores += tf.where(emit, symbol_log_prob, 0.0)
        (tokens, token_frames, log_ps, counts), (pred_out, state, pred_proj) = emit_and_advance(
            model, emit, symbol, t + first + first_frame, symbol_log_prob,
            (tokens, token_frames, log_ps, counts), (pred_out, state, pred_proj),
        )  # fmt: skip
        if boost is not None:
            where = advanced(boost, where, symbol, emit)
        run = tf.where(first > 0, 0, run) + 1
        full = emit & (run >= max_symbols_per_step)  # this frame has had its symbols
        t = tf.where(emit, t + first + tf.cast(full, tf.int32), t + window)
        run = tf.where(emit & ~full, run, 0)
        t = tf.where(active, t, lengths)
        return (t, run, pred_out, state, pred_proj, tokens, token_frames, log_ps, counts, scores,
                where)  # fmt: skip

    result = tf.while_loop(lambda t, *_: tf.reduce_any(t < lengths), body, loop)
    boosted = (result[10],) if boost is not None else ()
    return Found(*result[5:10]), (result[2], result[3], *boosted)


def best_symbols(log_probs, boost=None, where=None):
    """[B, W, V] log-probs -> each position's chosen symbol and its log-prob [B, W]: the
    most probable, or with `boost` tables the one whose log-prob plus the row's automata
    score (states `where` [B, A], held through the window) is highest."""
    if boost is None:
        return tf.argmax(log_probs, axis=-1, output_type=tf.int32), tf.reduce_max(log_probs, -1)
    ranked = log_probs + step_scores(boost, where)[:, None, :]
    best = tf.argmax(ranked, axis=-1, output_type=tf.int32)
    return best, tf.gather(log_probs, best[..., None], batch_dims=2)[..., 0]


def fusion_start(boost, shape):
    """Automata states at their start for hypotheses of `shape` ([*shape, A]; no automaton
    without `boost`)."""
    if boost is None:
        return tf.zeros(tf.concat([shape, [0]], axis=0), tf.int32)
    return start_states(boost, shape)


def window_hidden(joint, projected, pred_proj, t, window, lengths):
    """The joint's hidden vectors of each row's predictor state with its next `window`
    frames: projected [B, T, D] (the encoder's half, for every frame), pred_proj [B, D],
    t [B] -> (valid [B, W]: frame < length, hidden [B, W, D]; past the last frame it holds
    the last frame's)."""
    at = t[:, None] + tf.range(window)
    last = tf.shape(projected)[1] - 1
    hidden = tf.gather(projected, tf.minimum(at, last), axis=1, batch_dims=1)
    return at < lengths[:, None], joint.activate(hidden + pred_proj[:, None, :])


def emit_and_advance(model, emit, best, frames, best_log_prob, found, carry):
    """`record_emissions` and `advance_where`, run only when some row emits: a step where
    every row emits blank (most steps, and every one of a single utterance's blank frames)
    leaves `found` (tokens, token_frames, log_ps, counts) and `carry` (pred_out, state,
    pred_proj: the joint's projection of pred_out) as they are without the scatters, a
    predictor step or a projection."""

    def emitted():
        recorded = record_emissions(emit, best, frames, best_log_prob, *found)
        pred_out, state = advance_where(model.predictor, emit, best, *carry[:2])
        return recorded, (pred_out, state, model.joint.predictor_proj(pred_out))

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
