"""Self-attention with relative positions against NeMo's own RelPositionMultiHeadAttention
(its weights read from the fixture's PyTorch checkpoint by asrkit's reader), the relative
shift against its definition, the masked softmax's written gradient against NumPy's
differences, and a stream's attention (history keys, distances taken by index) against the
whole sequence's under chunk masks, for both position encodings."""

from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf

from asrkit.importers.torch_checkpoint import read_torch_checkpoint
from asrkit.models.attention import (
    SelfAttention,
    masked_softmax,
    masked_softmax_trained,
    relative_embeddings,
    relative_shift,
)
from asrkit.models.conformer import chunk_mask

NEMO = Path(__file__).resolve().parents[1] / "data" / "nemo"


def test_the_relative_shift_puts_distance_i_minus_j_in_column_j():
    frames = 5
    rng = np.random.default_rng(0)
    by_distance = rng.standard_normal((2, 3, frames, 2 * frames - 1)).astype(np.float32)
    shifted = relative_shift(tf.constant(by_distance)).numpy()[..., :frames]
    for i in range(frames):
        for j in range(frames):
            # column c of the unshifted scores holds distance (T - 1) - c
            np.testing.assert_array_equal(
                shifted[..., i, j], by_distance[..., i, frames - 1 - (i - j)]
            )


def _softmax_loss64(scores, keep, scale, upstream):
    """float64 NumPy: sum(upstream * masked softmax(scores / scale)) per the definition."""
    z = np.where(keep, scores / scale, -np.inf)
    z = z - np.max(np.where(keep, z, -1e300), axis=-1, keepdims=True)
    e = np.where(keep, np.exp(z), 0.0)
    total = e.sum(axis=-1, keepdims=True)
    weights = np.divide(e, total, out=np.zeros_like(e), where=total > 0)
    return float((upstream * weights).sum())


def test_the_masked_softmax_gradient_is_the_derivative_of_its_weights():
    rng = np.random.default_rng(3)
    scores = rng.standard_normal((2, 2, 4, 5)) * 3
    keep = rng.random((2, 1, 4, 5)) > 0.3
    keep[1, 0, 2] = False  # a query with no key left: weights and gradient 0
    upstream = rng.standard_normal((2, 2, 4, 5))
    scale = 2.0
    s = tf.constant(scores, tf.float32)
    with tf.GradientTape(persistent=True) as tape:
        tape.watch(s)
        trained = masked_softmax_trained(s, tf.constant(keep), scale)
        plain = masked_softmax(s, tf.constant(keep), scale)
        trained_loss = tf.reduce_sum(trained * upstream)
        plain_loss = tf.reduce_sum(plain * upstream)
    np.testing.assert_array_equal(trained.numpy(), plain.numpy())
    got = tape.gradient(trained_loss, s).numpy()
    np.testing.assert_allclose(got, tape.gradient(plain_loss, s).numpy(), atol=1e-6)
    expected = np.zeros_like(scores)  # central differences in float64
    step = 1e-6
    for index in np.ndindex(scores.shape):
        up, down = scores.copy(), scores.copy()
        up[index] += step
        down[index] -= step
        expected[index] = (_softmax_loss64(up, keep, scale, upstream)
                           - _softmax_loss64(down, keep, scale, upstream)) / (2 * step)  # fmt: skip
    np.testing.assert_allclose(got, expected, atol=1e-5)
    assert np.abs(expected).max() > 0.1 and not got[1, :, 2].any()


def test_attention_equals_nemos_on_a_padded_batch():
    weights = read_torch_checkpoint(NEMO / "rel_attention.ckpt")
    data = np.load(NEMO / "rel_attention.npz")
    x, lengths = data["x"], data["lengths"]
    d_model = x.shape[-1]
    heads = weights["pos_bias_u"].shape[0]
    np.testing.assert_allclose(
        relative_embeddings(x.shape[1], d_model).numpy(), data["pos_emb"][0], atol=1e-6
    )
    layer = SelfAttention(d_model=d_model, num_heads=heads, dropout=0.0, positions="relative")
    valid = tf.sequence_mask(lengths, x.shape[1])
    layer(tf.constant(x), valid)
    names = ("linear_q", "linear_k", "linear_v")
    layer.qkv.kernel.assign(np.concatenate([weights[f"{n}.weight"].T for n in names], axis=1))
    layer.qkv.bias.assign(np.concatenate([weights[f"{n}.bias"] for n in names]))
    layer.out.kernel.assign(weights["linear_out.weight"].T)
    layer.out.bias.assign(weights["linear_out.bias"])
    layer.position.kernel.assign(weights["linear_pos.weight"].T)
    layer.pos_bias_u.assign(weights["pos_bias_u"])
    layer.pos_bias_v.assign(weights["pos_bias_v"])
    got = layer(tf.constant(x), valid).numpy()
    for b, n in enumerate(lengths):  # NeMo's padded queries are not asrkit's concern
        np.testing.assert_allclose(got[b, :n], data["y"][b, :n], atol=1e-5, rtol=0)
    assert np.abs(data["y"]).max() > 0.1  # not a trivial output


@pytest.mark.parametrize("positions", ["rotary", "relative"])
@pytest.mark.parametrize(("chunk", "left"), [(2, -1), (3, 1), (1, 0)])
def test_a_stream_attends_as_the_whole_sequence_does(positions, chunk, left):
    """Frames fed a chunk at a time with the history's keys and values (the kept chunks
    only, as the encoder keeps them) = one call on the whole sequence under the chunk
    mask; the relative distances come from the stream's own offsets."""
    rng = np.random.default_rng(5)
    frames, d_model = 11, 8
    layer = SelfAttention(d_model=d_model, num_heads=2, dropout=0.0, positions=positions)
    x = tf.constant(rng.standard_normal((1, frames, d_model)), tf.float32)
    positions_all = tf.range(frames)
    allowed = chunk_mask(positions_all, positions_all, chunk, left)
    whole = layer(x, tf.ones([1, frames], tf.bool), allowed=allowed).numpy()
    if positions == "relative":  # nonzero biases, so u and v are exercised
        layer.pos_bias_u.assign(rng.standard_normal(layer.pos_bias_u.shape))
        layer.pos_bias_v.assign(rng.standard_normal(layer.pos_bias_v.shape))
        whole = layer(x, tf.ones([1, frames], tf.bool), allowed=allowed).numpy()
    empty = tf.zeros([1, 0, 2, d_model // 2])
    keys, values, outs = empty, empty, []
    for start in range(0, frames, chunk):
        piece = x[:, start : start + chunk]
        history = keys.shape[1]
        query_at = start + tf.range(piece.shape[1])
        key_at = start - history + tf.range(history + piece.shape[1])
        out, keys, values = layer.stream(piece, keys, values, start,
                                         chunk_mask(query_at, key_at, chunk, left))  # fmt: skip
        if left >= 0:
            keys, values = (
                keys[:, max(keys.shape[1] - left * chunk, 0) :],
                values[:, max(values.shape[1] - left * chunk, 0) :],
            )
        outs.append(out.numpy())
    np.testing.assert_allclose(np.concatenate(outs, axis=1), whole, atol=1e-5)
