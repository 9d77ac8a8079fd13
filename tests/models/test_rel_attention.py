"""Relative-position self-attention against NeMo's own RelPositionMultiHeadAttention (its
weights read from the fixture's PyTorch checkpoint by asrkit's reader), and the relative
shift against its definition."""

from pathlib import Path

import numpy as np
import tensorflow as tf

from asrkit.importers.torch_checkpoint import read_torch_checkpoint
from asrkit.models.rel_attention import (
    RelPositionSelfAttention,
    relative_embeddings,
    relative_shift,
)

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


def test_attention_equals_nemos_on_a_padded_batch():
    weights = read_torch_checkpoint(NEMO / "rel_attention.ckpt")
    data = np.load(NEMO / "rel_attention.npz")
    x, lengths = data["x"], data["lengths"]
    d_model = x.shape[-1]
    heads = weights["pos_bias_u"].shape[0]
    np.testing.assert_allclose(
        relative_embeddings(x.shape[1], d_model).numpy(), data["pos_emb"][0], atol=1e-6
    )
    layer = RelPositionSelfAttention(d_model=d_model, num_heads=heads)
    valid = tf.sequence_mask(lengths, x.shape[1])
    layer(tf.constant(x), valid)
    for dense, name in ((layer.query, "linear_q"), (layer.key, "linear_k"),
                        (layer.value, "linear_v"), (layer.out, "linear_out")):  # fmt: skip
        dense.kernel.assign(weights[f"{name}.weight"].T)
        dense.bias.assign(weights[f"{name}.bias"])
    layer.position.kernel.assign(weights["linear_pos.weight"].T)
    layer.pos_bias_u.assign(weights["pos_bias_u"])
    layer.pos_bias_v.assign(weights["pos_bias_v"])
    got = layer(tf.constant(x), valid).numpy()
    np.testing.assert_allclose(got, data["y"], atol=1e-5, rtol=0)
    assert np.abs(data["y"]).max() > 0.1  # not a trivial output
