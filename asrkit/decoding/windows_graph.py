"""The long-audio windows of `asrkit.decoding.long_audio` in TensorFlow ops, so an exported
graph decodes a recording of any length in bounded memory: the same cuts at the same quiet
points (`graph_cut_points` equals `cut_points`), the same windows, and the same rule for
joining them (each window keeps the tokens of the words that start inside its segment).
"""

from __future__ import annotations

import tensorflow as tf

from asrkit.decoding.long_audio import ENERGY_HOP_SECONDS, Windowing


def graph_cut_points(samples, rate: int, windowing: Windowing) -> tf.Tensor:
    """int32 [K + 1]: sample positions of the cuts, 0 first and len(samples) last, as
    `cut_points` finds them (smoothed energy in float64, the first of equally quiet
    frames)."""
    total = tf.shape(samples)[0]
    limit = int(windowing.max_seconds * rate)
    hop = max(1, int(ENERGY_HOP_SECONDS * rate))
    search = int(windowing.search_seconds * rate)
    width = max(1, round(windowing.smooth_seconds / ENERGY_HOP_SECONDS))
    usable = total // hop * hop
    power = tf.reduce_mean(
        tf.reshape(tf.square(tf.cast(samples[:usable], tf.float64)), [-1, hop]), axis=1
    )
    # np.convolve(power, box, "same"): frame i averages power[i - w // 2 .. i + (w - 1) // 2]
    padded = tf.pad(power, [[width // 2 + 1, (width - 1) // 2]])
    running = tf.cumsum(padded)
    smooth = (running[width:] - running[:-width]) / width
    frames = tf.shape(smooth)[0]

    def more(cuts):
        return total - cuts[-1] > limit

    def next_cut(cuts):
        lo = (cuts[-1] + limit - search) // hop
        hi = tf.minimum((cuts[-1] + limit) // hop, frames)
        part = smooth[lo:hi]
        lowest = tf.reduce_min(part)
        first = tf.reduce_min(tf.where(part == lowest, tf.range(hi - lo), hi - lo))
        return (tf.concat([cuts, [(lo + first) * hop + hop // 2]], 0),)

    (cuts,) = tf.while_loop(
        more, next_cut, (tf.zeros([1], tf.int32),), shape_invariants=(tf.TensorShape([None]),)
    )
    return tf.concat([cuts, [total]], 0)


def graph_windows(samples, rate: int, windowing: Windowing, step: int):
    """(starts, ends) int32 [K] of the samples decoded per window (each start a multiple
    of `step`), and (keep_from, keep_to) float32 [K] seconds: the segment whose words the
    window keeps (-inf / +inf at the recording's ends), as `plan_windows` plans them."""
    cuts = graph_cut_points(samples, rate, windowing)
    context = int(windowing.context_seconds * rate)
    total = tf.shape(samples)[0]
    a, b = cuts[:-1], cuts[1:]
    starts = tf.maximum(a - context, 0) // step * step
    ends = tf.minimum(b + context, total)
    count = tf.shape(a)[0]
    inf = tf.constant(float("inf"))
    position = tf.range(count)
    keep_from = tf.where(position > 0, tf.cast(a, tf.float32) / rate, -inf)
    keep_to = tf.where(position < count - 1, tf.cast(b, tf.float32) / rate, inf)
    return starts, ends, keep_from, keep_to
