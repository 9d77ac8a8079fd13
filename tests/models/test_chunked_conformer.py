"""The chunked (streaming) Conformer: its attention mask against a brute-force rule, and
a frame's output independent of every later chunk (masks + causal convolution), checked by
changing the audio after a chunk's end."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from asrkit.models.conformer import ConformerEncoder, chunk_mask, dynamic_chunk_frames


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


def test_dynamic_chunks_are_a_function_of_the_update_half_of_them_full_context():
    draws = np.array([int(dynamic_chunk_frames(u, 8)) for u in range(2000)])
    assert set(draws) == set(range(9))  # 0 (full context) and every size 1..8
    assert 900 < np.sum(draws == 0) < 1100  # half, within ~4.5 standard deviations
    counts = np.bincount(draws[draws > 0])[1:]
    assert counts.min() > 0.7 * counts.mean()  # the sizes uniform
    again = [int(dynamic_chunk_frames(u, 8)) for u in (0, 17, 1999)]
    assert again == [draws[0], draws[17], draws[1999]]
    compiled = tf.function(lambda u: dynamic_chunk_frames(u, 8))
    assert [int(compiled(tf.constant(u, tf.int64))) for u in (5, 6, 7)] == list(draws[5:8])


@pytest.mark.parametrize("chunk", [1, 3, 0])
def test_a_call_with_a_chunk_size_equals_an_encoder_built_with_it(chunk):
    """Dynamic chunk training's per-call chunk (a tensor) = the same weights configured
    with that chunk (0: full context = one chunk longer than any utterance); the
    convolution stays causal either way."""
    keras.utils.set_random_seed(4)
    kwargs = dict(d_model=16, num_blocks=2, num_heads=2, kernel_size=5, dropout=0.0,
                  subsampling_filters=8)  # fmt: skip
    dynamic = ConformerEncoder(**kwargs, chunk_frames=4, dynamic_chunks=8)
    fixed = ConformerEncoder(**kwargs, chunk_frames=chunk or 10_000)
    rng = np.random.default_rng(1)
    features = rng.standard_normal((2, 90, 80)).astype(np.float32)
    lengths = np.array([90, 61])
    got, _ = dynamic(features, lengths, chunk_frames=tf.constant(chunk))
    fixed(features, lengths)
    fixed.set_weights(dynamic.get_weights())
    want, _ = fixed(features, lengths)
    np.testing.assert_allclose(got.numpy(), want.numpy(), atol=1e-5)
    default, _ = dynamic(features, lengths)  # the configured 4 frames
    assert chunk == 4 or not np.allclose(default.numpy(), got.numpy(), atol=1e-3)
