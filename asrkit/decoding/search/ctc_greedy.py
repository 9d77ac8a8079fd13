"""Greedy CTC search on a hybrid network's CTC head (`model.ctc_head`): the best symbol of
every frame, repeats merged, blanks removed — as NeMo's CTC greedy decoding does.

A token is placed at the first frame of its run; its log-prob is that frame's; the score
is the log-probability of the frame-wise best path (every frame's best log-prob summed).
"""

from __future__ import annotations

import tensorflow as tf

from asrkit.decoding.search.found import Found
from asrkit.tokenizer import BLANK_ID


def ctc_greedy_search(model, encoded, encoder_lengths) -> Found:
    """encoded [B, T, D], encoder_lengths [B] -> `Found` with one hypothesis per row
    ([B, T] token slots, -1 past each row's count)."""
    log_probs = tf.nn.log_softmax(tf.cast(model.ctc_logits(encoded), tf.float32), axis=-1)
    frames = tf.shape(log_probs)[1]
    best = tf.argmax(log_probs, axis=-1, output_type=tf.int32)  # [B, T]
    best_log_prob = tf.reduce_max(log_probs, axis=-1)
    valid = tf.range(frames)[None, :] < tf.cast(encoder_lengths, tf.int32)[:, None]
    previous = tf.pad(best[:, :-1], [[0, 0], [1, 0]], constant_values=BLANK_ID)
    keep = valid & tf.not_equal(best, BLANK_ID) & tf.not_equal(best, previous)
    # The kept frames first, in order (a stable sort of "not kept"), then the rest.
    order = tf.argsort(tf.cast(~keep, tf.int32), axis=1, stable=True)
    counts = tf.reduce_sum(tf.cast(keep, tf.int32), axis=1)
    filled = tf.range(frames)[None, :] < counts[:, None]
    tokens = tf.where(filled, tf.gather(best, order, batch_dims=1), -1)
    token_frames = tf.where(filled, order, -1)
    token_log_probs = tf.where(filled, tf.gather(best_log_prob, order, batch_dims=1), 0.0)
    scores = tf.reduce_sum(tf.where(valid, best_log_prob, 0.0), axis=1)
    return Found(tokens, token_frames, token_log_probs, counts, scores)
