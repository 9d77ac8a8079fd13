"""Batched beam search for transducers, in graph mode: modified beam search, generalised
to at most S symbols per encoder frame.

With S = 1 this is k2/icefall's modified beam search: at frame t each of the K hypotheses
of an utterance is extended by every symbol (blank keeps its tokens, any other symbol
appends one), the K best candidates survive, and survivors with the same token sequence
are merged — their probabilities add (log-sum-exp) into the best of them.

With S > 1 a frame takes up to S rounds. In each round a hypothesis that has not finished
the frame is extended by every symbol: blank finishes the frame, another symbol appends
and stays for the next round — except in round S, which finishes the frame as greedy
search does after its S-th symbol. Finished hypotheses compete unchanged. This is the
search space of `greedy_search` with the same S, so beam 1 *is* greedy search, and a wide
enough beam is exact (both tested). Rounds stop early once every hypothesis has finished.

Utterances are rows of one batch; a row past its `encoder_lengths` keeps its hypotheses.
Sequences are compared through a rolling hash plus their length. Uses only `encode`,
`predictor.step` and `join`.
"""

from __future__ import annotations

from typing import NamedTuple

import tensorflow as tf

from asrkit.config import DecodeConfig
from asrkit.decoding.fusion.steps import advanced, final_scores, step_scores
from asrkit.decoding.search.found import Found
from asrkit.decoding.search.greedy import fusion_start
from asrkit.tokenizer import BLANK_ID

SYMBOLS = DecodeConfig.max_symbols_per_step  # the config's default, defined there once

DEAD_SCORE = -1e9  # score of an empty beam slot; finite so that sums never make NaN
_HASH_MODULUS = 2_147_483_647  # 2^31 - 1: hash · multiplier stays inside int64
_HASH_MULTIPLIER = 1_000_003


def beam_search(
    model, encoded, encoder_lengths, beam: int = 4, max_symbols_per_step: int = SYMBOLS,
    boost=None,
):  # fmt: skip
    """encoded [B, T, D] -> `Found`: tokens/frames/token_log_probs [B, K, T·S], counts and
    scores [B, K].

    Hypotheses are sorted best first; token slots past counts[b, k] hold -1; a score is
    the log-probability of the hypothesis (summed over the alignments merged into it); a
    token's log-prob is the joint's log-posterior of it on the alignment that was kept.
    With `boost` (`FusionTables` as tensors, `asrkit.decoding.fusion.tables`) a score also holds
    what the hypothesis's automata earned (word boosting, LM fusion), final scores included.
    """
    beams = beam_start(model, tf.shape(encoded)[0], beam)
    if boost is None:
        beams = beam_continue(model, encoded, encoder_lengths, beams, max_symbols_per_step)
        return beam_found(beams)
    where = fusion_start(boost, tf.shape(beams.counts))
    beams, where = beam_continue(
        model, encoded, encoder_lengths, beams, max_symbols_per_step, boost=(boost, where)
    )
    return beam_found(taken_back(beams, boost, where))


def with_room(beams: Beams, tokens) -> Beams:
    """`beams` with `tokens` more empty token positions per hypothesis."""
    more = [[0, 0], [0, 0], [0, tokens]]
    return beams._replace(
        tokens=tf.pad(beams.tokens, more, constant_values=-1),
        frames=tf.pad(beams.frames, more, constant_values=-1),
        log_probs=tf.pad(beams.log_probs, more),
    )


def beam_start(model, batch, beam: int) -> Beams:
    """The K hypotheses of each utterance before any frame: one empty, K - 1 empty slots."""
    k = int(beam)
    predictor = model.predictor
    pred_out, state = predictor.step(
        tf.fill([batch * k], BLANK_ID), predictor.initial_state(batch * k)
    )
    return Beams(
        pred_out=pred_out,
        state=state,
        tokens=tf.fill([batch, k, 0], -1),
        frames=tf.fill([batch, k, 0], -1),
        log_probs=tf.zeros([batch, k, 0], tf.float32),
        counts=tf.zeros([batch, k], tf.int32),
        scores=tf.concat([tf.zeros([batch, 1]), tf.fill([batch, k - 1], DEAD_SCORE)], axis=1),
        hashes=tf.zeros([batch, k], tf.int64),
    )


def beam_continue(
    model,
    encoded,
    encoder_lengths,
    beams: Beams,
    max_symbols_per_step: int = SYMBOLS,
    first_frame=0,
    boost=None,
):
    """The search over `encoded` from `beams` (`beam_start`, or what an earlier call on the
    frames before returned). Token frames count from `first_frame`, so a stream searched
    piece by piece keeps exactly the hypotheses one call on the whole utterance keeps.
    `boost`: (fusion tables as tensors, [B, K, A] automata states) -> returns (beams, states)."""
    num_frames = tf.shape(encoded)[1]
    rounds = int(max_symbols_per_step)
    beams = with_room(beams, num_frames * rounds)  # S tokens per new frame
    slot = tf.range(tf.shape(beams.scores)[1])
    tables, where = boost or (None, fusion_start(None, tf.shape(beams.counts)))

    def frame_body(t, entering, where):
        not_done = tf.zeros_like(entering.counts, tf.bool)
        scores = merge_equal(entering.scores, [entering.hashes, entering.counts, not_done], slot)
        beams = entering._replace(scores=scores)
        done = tf.tile(~(t < encoder_lengths)[:, None], [1, tf.size(slot)])  # past the end
        frame = tf.repeat(encoded[:, t, :], tf.size(slot), axis=0)  # [B·K, D]

        def round_body(s, done, beams, where):
            last_round = s == rounds - 1
            expanded = _expand(model, frame, t + first_frame, last_round, done, beams, slot,
                               tables, where)  # fmt: skip
            return (s + 1, *expanded)

        _, _, beams, where = tf.while_loop(
            lambda s, done, *_: tf.logical_and(s < rounds, ~tf.reduce_all(done)),
            round_body,
            [0, done, beams, where],
        )
        return t + 1, same_shapes(beams, entering), where

    _, beams, where = tf.while_loop(lambda t, *_: t < num_frames, frame_body, [0, beams, where])
    return beams if boost is None else (beams, where)


def beam_found(beams: Beams) -> Found:
    """The hypotheses as a `Found`, best first."""
    order = tf.argsort(beams.scores, axis=1, direction="DESCENDING", stable=True)
    fields = (beams.tokens, beams.frames, beams.log_probs, beams.counts, beams.scores)
    return Found(*(tf.gather(x, order, batch_dims=1) for x in fields))


def taken_back(beams: Beams, boost, where) -> Beams:
    """`beams` at the end of the utterance: each hypothesis's automata (states `where`
    [B, K, A]) end, earning their final scores (open boosted matches taken back, the LM's
    end of sentence)."""
    return beams._replace(scores=beams.scores + final_scores(boost, where))


def live_slots(scores):
    """[B, K] scores of hypotheses sorted best first -> which hold a hypothesis (an
    utterance with fewer distinct hypotheses than the beam leaves empty slots; the first
    always holds one)."""
    first = tf.range(tf.shape(scores)[-1]) == 0
    return tf.logical_or(first, scores > DEAD_SCORE / 2)


class Beams(NamedTuple):
    """K hypotheses per utterance; predictor tensors are flattened to B·K rows."""

    pred_out: tf.Tensor  # [B·K, Dp]
    state: list  # predictor state, [B·K, ...] tensors
    tokens: tf.Tensor  # [B, K, T·S]
    frames: tf.Tensor  # [B, K, T·S]
    log_probs: tf.Tensor  # [B, K, T·S]: each token's log-posterior where it was emitted
    counts: tf.Tensor  # [B, K]
    scores: tf.Tensor  # [B, K]
    hashes: tf.Tensor  # [B, K]


def _expand(model, frame, t, last_round, done, beams: Beams, slot, boost=None, where=None):
    """One round at frame t: every unfinished hypothesis x every symbol, finished ones as
    they are; keep the K best, merge equal sequences, advance the predictor (and, with
    `boost` tables, each hypothesis's automata states `where` [B, K, A])."""
    batch, k = tf.shape(beams.scores)[0], tf.size(slot)
    log_probs = tf.nn.log_softmax(tf.cast(model.join(frame, beams.pred_out), tf.float32))
    vocab = tf.shape(log_probs)[-1]
    log_probs = tf.reshape(log_probs, [batch, k, vocab])
    extended = beams.scores[:, :, None] + log_probs
    if boost is not None:
        extended += step_scores(boost, where)  # [B, K, V]; blank earns nothing
    extended = tf.where(done[:, :, None], DEAD_SCORE, extended)
    stay = tf.where(done, beams.scores, DEAD_SCORE)[:, :, None]
    candidates = tf.reshape(tf.concat([stay, extended], axis=2), [batch, k * (vocab + 1)])
    top_scores, top = tf.math.top_k(candidates, k=k)  # ties: the lower index first
    parent, column = top // (vocab + 1), top % (vocab + 1)
    symbol = column - 1  # column 0: stay, 1 + v: symbol v
    emit = tf.logical_and(column > 0, symbol != BLANK_ID)
    new_done = tf.ensure_shape(tf.logical_or(column <= 1, last_round), done.shape)

    symbol_log_prob = tf.gather(
        tf.gather(log_probs, parent, batch_dims=1), tf.maximum(symbol, 0), batch_dims=2
    )
    new = extend(model, beams, parent, symbol, emit, t, symbol_log_prob)
    new = new._replace(scores=merge_equal(top_scores, [new.hashes, new.counts, new_done], slot))
    if boost is not None:  # equal sequences are in one automaton state: merging keeps it
        where = advanced(boost, tf.gather(where, parent, batch_dims=1), symbol, emit)
    return new_done, same_shapes(new, beams), where


def extend(model, beams: Beams, parent, symbol, emit, t, symbol_log_prob) -> Beams:
    """The hypotheses chosen by one expansion: [B, K] `parent` slots, each extended by
    `symbol` where `emit` (written at encoder frame `t`, a scalar or [B, K], with its
    `symbol_log_prob`) or kept as it was; the predictor advanced where a token was
    appended. Scores are left to the caller."""
    counts_p = tf.gather(beams.counts, parent, batch_dims=1)
    capacity = tf.shape(beams.tokens)[2]
    write = tf.logical_and(tf.one_hot(counts_p, capacity, True, False), emit[..., None])
    t = tf.convert_to_tensor(t)
    at = t if t.shape.rank == 0 else t[..., None]
    tokens = tf.where(write, symbol[..., None], tf.gather(beams.tokens, parent, batch_dims=1))
    frames = tf.where(write, at, tf.gather(beams.frames, parent, batch_dims=1))
    token_log_probs = tf.where(
        write, symbol_log_prob[..., None], tf.gather(beams.log_probs, parent, batch_dims=1)
    )
    hashes_p = tf.gather(beams.hashes, parent, batch_dims=1)
    extended = (hashes_p * _HASH_MULTIPLIER + tf.cast(symbol, tf.int64) + 1) % _HASH_MODULUS

    batch, k = tf.shape(parent)[0], tf.shape(parent)[1]
    rows = tf.reshape(parent + (tf.range(batch) * k)[:, None], [-1])
    flat_emit = tf.reshape(emit, [-1, 1])
    kept_out = tf.gather(beams.pred_out, rows)
    kept_state = tf.nest.map_structure(lambda x: tf.gather(x, rows), beams.state)
    stepped_out, stepped_state = model.predictor.step(
        tf.where(tf.reshape(emit, [-1]), tf.reshape(symbol, [-1]), BLANK_ID), kept_state
    )
    pick = lambda new, old: tf.where(flat_emit, new, old)  # noqa: E731
    return Beams(
        pred_out=pick(stepped_out, kept_out),
        state=tf.nest.map_structure(pick, stepped_state, kept_state),
        tokens=tokens,
        frames=frames,
        log_probs=token_log_probs,
        counts=counts_p + tf.cast(emit, tf.int32),
        scores=tf.gather(beams.scores, parent, batch_dims=1),
        hashes=tf.where(emit, extended, hashes_p),
    )


def same_shapes(new: Beams, old: Beams) -> Beams:
    """The static shapes the loop variables entered with (dynamic ops lose what tracing
    knew, and tf.while_loop rejects a loop variable whose shape loosens)."""
    return tf.nest.map_structure(lambda n, o: tf.ensure_shape(n, o.shape), new, old)


def merge_equal(scores, keys, slot):
    """[B, K] scores -> the same with each group of hypotheses equal in every [B, K] key
    (a sequence's hash and length, and whatever else makes two hypotheses one search
    state) log-summed into its first member and the others set to `DEAD_SCORE`."""
    same = tf.ones_like(scores[:, :, None] < scores[:, None, :], tf.bool)
    for key in keys:
        same &= key[:, :, None] == key[:, None, :]  # [B, K, K]
    first = tf.reduce_min(tf.where(same, slot[None, None, :], tf.size(slot)), axis=-1)
    merged = tf.reduce_logsumexp(tf.where(same, scores[:, None, :], DEAD_SCORE), axis=-1)
    return tf.where(first == slot, merged, DEAD_SCORE)
