"""The chunked (streaming) Conformer: its attention mask against a brute-force rule, and
a frame's output independent of every later chunk (masks + causal convolution), checked by
changing the audio after a chunk's end."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from asrkit.models.conformer import ConformerEncoder, chunk_mask


@pytest.mark.parametrize(("chunk", "left"), [(1, 0), (3, 1), (4, -1), (2, 3)])
def test_chunk_mask_matches_the_rule(chunk, left):
    queries, keys = np.arange(5, 17), np.arange(0, 17)
    got = chunk_mask(tf.constant(queries), tf.constant(keys), chunk, left).numpy()
    for i, q in enumerate(queries):
        for j, k in enumerate(keys):
            own, other = q // chunk, k // chunk
            assert got[i, j] == (other <= own and (left < 0 or other >= own - left)), (q, k)


@pytest.mark.parametrize("left", [1, -1])
def test_a_frame_never_depends_on_later_chunks(left):
    keras.utils.set_random_seed(3)
    encoder = ConformerEncoder(d_model=16, num_blocks=2, num_heads=2, kernel_size=5,
                               dropout=0.0, subsampling_filters=8, chunk_frames=3,
                               left_chunks=left)  # fmt: skip
    rng = np.random.default_rng(0)
    features = rng.standard_normal((1, 120, 80)).astype(np.float32)
    lengths = np.array([120])
    base, _ = encoder(features, lengths)
    frames = base.shape[1]
    for boundary in (3, 9, 15):  # encoder frames in chunks before `boundary` are final
        changed = features.copy()
        # encoder frame t sees feature frames up to 4t + 6: change only what frame
        # `boundary` and later see first
        changed[:, 4 * boundary + 6 :] = rng.standard_normal(changed[:, 4 * boundary + 6 :].shape)
        out, _ = encoder(changed, lengths)
        np.testing.assert_allclose(out[:, :boundary], base[:, :boundary], atol=1e-5)
        assert not np.allclose(out[:, boundary:frames], base[:, boundary:frames], atol=1e-3)
    full = ConformerEncoder(d_model=16, num_blocks=2, num_heads=2, kernel_size=5, dropout=0.0,
                            subsampling_filters=8)  # fmt: skip
    full(features, lengths)
    full.set_weights(encoder.get_weights())  # same weights, full context: the past changes
    changed = features.copy()
    changed[:, 4 * 9 + 6 :] += 1.0
    assert not np.allclose(full(changed, lengths)[0][:, :9], full(features, lengths)[0][:, :9],
                           atol=1e-3)  # fmt: skip
