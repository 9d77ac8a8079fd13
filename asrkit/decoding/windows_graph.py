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
    power = _frame_power(samples, hop)
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


# Frames whose energy is computed at once: the float64 copy of a whole recording would cost
# 8 bytes per sample (230 MB for 30 minutes), a block of these 2.5 MB.
POWER_BLOCK_FRAMES = 1000


def _frame_power(samples, hop: int) -> tf.Tensor:
    """float64 [F]: the mean square of each whole `hop`-sample frame, computed a block of
    frames at a time (as `cut_points` computes it, in float64)."""
    frames = tf.shape(samples)[0] // hop
    blocks = (frames + POWER_BLOCK_FRAMES - 1) // POWER_BLOCK_FRAMES

    def block(i, found):  # sliced from the samples a block at a time: no whole copy
        first = i * POWER_BLOCK_FRAMES
        last = tf.minimum(first + POWER_BLOCK_FRAMES, frames)
        part = tf.reshape(samples[first * hop : last * hop], [-1, hop])
        return i + 1, found.write(i, tf.reduce_mean(tf.square(tf.cast(part, tf.float64)), 1))

    found = tf.TensorArray(tf.float64, size=blocks, infer_shape=False,
                           element_shape=tf.TensorShape([None]))  # fmt: skip
    _, found = tf.while_loop(lambda i, _: i < blocks, block, (0, found), parallel_iterations=1)
    return found.concat()


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
