"""Chunk loops: the losses that never hold a [B, T, X, V] tensor (the fused RNN-T and TDT
losses, the pruned loss' band and its trivial joiner) evaluate their joint a chunk of
frames at a time, in a `tf.while_loop` of one chunk at a time, sized from a memory budget
by one function (`joint_chunk_frames`). Their forward passes share `map_chunks` (per-frame
outputs of every chunk, stitched) and their backward passes `accumulate_chunks` (a
per-frame gradient stitched, and gradients summed over chunks)."""

from __future__ import annotations

import tensorflow as tf

DEFAULT_CHUNK_BYTES = 64 * 2**20


def joint_chunk_frames(encoded, cells, hidden, vocab, chunk_bytes, chunk_frames=None):
    """Frames per chunk (int32 scalar) of a joint evaluated on `cells` cells per frame
    (U+1 for the whole lattice, S for a band, 1 for the trivial joiner's frames) of width
    `hidden` into `vocab` outputs: `chunk_frames` if given, else as many as fit
    `chunk_bytes` — per frame the backward pass holds about B·cells·(6V + 4H) float32
    values at its peak (logits, softmax, the gradient and its terms; the hidden state, its
    float32 copy and two gradients; measured with `tools/bench_joint.py`). The sizes are
    Python ints when known while tracing (XLA traces per shape), else int64 tensors."""
    if chunk_frames is not None:
        if int(chunk_frames) < 1:
            raise ValueError(f"chunk_frames must be >= 1, got {chunk_frames}")
        return tf.constant(int(chunk_frames), tf.int32)
    batch, frames = encoded.shape[0], encoded.shape[1]
    if all(isinstance(d, int) for d in (batch, frames, cells, hidden, vocab)):
        per_frame = batch * cells * (6 * vocab + 4 * hidden) * 4
        return tf.constant(min(max(int(chunk_bytes) // max(per_frame, 1), 1), max(frames, 1)))
    # Integer arithmetic on shapes only, so that XLA can still evaluate it at compile time.
    shape = tf.shape(encoded, out_type=tf.int64)
    cells, hidden, vocab = (tf.cast(d, tf.int64) for d in (cells, hidden, vocab))
    per_frame = shape[0] * cells * (6 * vocab + 4 * hidden) * 4
    return frames_in_budget(chunk_bytes, per_frame, shape[1])


def static_or_dynamic(x, axis: int):
    """x's size on `axis`: a Python int if known while tracing, else a scalar tensor."""
    size = x.shape[axis]
    return int(size) if size is not None else tf.shape(x)[axis]


def frames_in_budget(chunk_bytes, per_frame, frames):
    """int32 frames per chunk: as many as `chunk_bytes` hold at `per_frame` bytes each, at
    least 1 and at most `frames` (int64 shape arithmetic, which XLA evaluates when it
    compiles)."""
    fit = tf.constant(int(chunk_bytes), tf.int64) // tf.maximum(per_frame, 1)
    return tf.cast(tf.clip_by_value(fit, 1, tf.maximum(frames, 1)), tf.int32)


def in_chunks(x, chunk):
    """[B, T, ...] -> [B, N, C, ...] (zero-padded to N·C frames) and N."""
    shape = tf.shape(x)
    chunks = (shape[1] + chunk - 1) // chunk
    paddings = [[0, 0], [0, chunks * chunk - shape[1]]] + [[0, 0]] * (x.shape.rank - 2)
    padded = tf.pad(x, paddings)
    return tf.reshape(padded, tf.concat([[shape[0], chunks, chunk], shape[2:]], 0)), chunks


def chunk_loop(chunks, body, init):
    """`body(i, *state)` for chunks i = 0 .. chunks - 1, one chunk at a time: the default
    lets up to 10 iterations run at once, each holding its chunk's temporaries, which
    multiplies the memory the chunks are sized to bound."""
    return tf.while_loop(lambda i, *_: i < chunks, body, init, parallel_iterations=1)


def stitch(array: tf.TensorArray, frames) -> tf.Tensor:
    """Chunks [N, B, C, ...] -> [B, T, ...] (padding frames dropped)."""
    stacked = array.stack()
    shape, rank = tf.shape(stacked), stacked.shape.rank
    moved = tf.transpose(stacked, [1, 0, *range(2, rank)])
    joined = tf.reshape(moved, tf.concat([[shape[1], -1], shape[3:]], 0))
    return joined[:, :frames]


def map_chunks(chunks, frames, chunk_fn, count: int) -> tuple[tf.Tensor, ...]:
    """`chunk_fn(i)` -> `count` float32 tensors [B, C, ...] for chunks i = 0 .. chunks - 1,
    one chunk at a time -> each stitched to [B, T, ...]."""

    def body(i, *arrays):
        outputs = chunk_fn(i)
        return (i + 1, *(a.write(i, x) for a, x in zip(arrays, outputs, strict=True)))

    arrays = [tf.TensorArray(tf.float32, size=chunks) for _ in range(count)]
    _, *arrays = chunk_loop(chunks, body, [tf.constant(0), *arrays])
    return tuple(stitch(a, frames) for a in arrays)


def accumulate_chunks(chunks, frames, chunk_fn, totals):
    """`chunk_fn(i)` -> (a float32 per-frame part [B, C, ...] of chunk i, one increment per
    tensor of `totals`), one chunk at a time -> (the parts stitched to [B, T, ...], the
    totals plus every chunk's increments)."""

    def body(i, parts, *sums):
        part, increments = chunk_fn(i)
        sums = [tf.ensure_shape(t + d, t.shape) for t, d in zip(sums, increments, strict=True)]
        return (i + 1, parts.write(i, part), *sums)

    init = [tf.constant(0), tf.TensorArray(tf.float32, size=chunks), *totals]
    _, parts, *sums = chunk_loop(chunks, body, init)
    return stitch(parts, frames), sums
