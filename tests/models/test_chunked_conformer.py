"""The chunked (streaming) Conformer: its attention mask against a brute-force rule, and
a frame's output independent of every later chunk (masks + causal convolution), checked by
changing the audio after a chunk's end."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from asrkit.features import encoder_frames
from asrkit.models.conformer import (
    ConformerEncoder,
    ConvolutionModule,
    chunk_mask,
    dynamic_chunk_frames,
)


@pytest.mark.parametrize(("chunk", "left"), [(1, 0), (3, 1), (4, -1), (2, 3)])
def test_chunk_mask_matches_the_rule(chunk, left):
    queries, keys = np.arange(5, 17), np.arange(0, 17)
    got = chunk_mask(tf.constant(queries), tf.constant(keys), chunk, left).numpy()
    for i, q in enumerate(queries):
        for j, k in enumerate(keys):
            own, other = q // chunk, k // chunk
            assert got[i, j] == (other <= own and (left < 0 or other >= own - left)), (q, k)


@pytest.mark.parametrize(
    ("left", "final_norm", "conv"),
    [
        (1, "none", "chunk"),
        (-1, "block", "causal"),
        (2, "encoder", "chunk"),
        (-1, "none", "causal"),
    ],
)
def test_a_frame_never_depends_on_later_chunks(left, final_norm, conv):
    keras.utils.set_random_seed(3)
    encoder = ConformerEncoder(d_model=16, num_blocks=2, num_heads=2, kernel_size=5,
                               dropout=0.0, subsampling_filters=8, chunk_frames=3,
                               conv_norm="layer",
                               left_chunks=left, final_norm=final_norm,
                               conv_context=conv)  # fmt: skip
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
                            subsampling_filters=8, final_norm=final_norm,
                            conv_norm="layer")  # fmt: skip
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
    compiled = tf.function(lambda u: dynamic_chunk_frames(u, 8), autograph=False)
    assert [int(compiled(tf.constant(u, tf.int64))) for u in (5, 6, 7)] == list(draws[5:8])


@pytest.mark.parametrize("conv", ["causal", "chunk"])
@pytest.mark.parametrize("chunk", [1, 3, 0])
def test_a_call_with_a_chunk_size_equals_an_encoder_built_with_it(chunk, conv):
    """Dynamic chunk training's per-call chunk (a tensor) = the same weights configured
    with that chunk (0: full context = one chunk longer than any utterance); a causal
    convolution stays causal either way, a chunked one follows the chunk."""
    keras.utils.set_random_seed(4)
    kwargs = dict(d_model=16, num_blocks=2, num_heads=2, kernel_size=5, dropout=0.0,
                  subsampling_filters=8, conv_context=conv, conv_norm="layer",
                  final_norm="block")  # fmt: skip
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


def _layer_norm(x, gamma, beta, epsilon):
    mean = x.mean(-1, keepdims=True)
    return gamma * (x - mean) / np.sqrt(x.var(-1, keepdims=True) + epsilon) + beta


@pytest.mark.parametrize("final_norm", ["block", "encoder"])
def test_the_final_norm_is_a_layer_norm_of_the_unnormalised_sum(final_norm):
    """One block, same weights: with a final norm ("block": the block's own, "encoder":
    after the blocks) the output is NumPy's LayerNorm of the "none" encoder's output on the
    real frames, with the norm's (random) scale and offset; padded frames stay 0."""
    keras.utils.set_random_seed(6)
    kwargs = dict(d_model=16, num_blocks=1, num_heads=2, kernel_size=5, dropout=0.0,
                  subsampling_filters=8, conv_norm="layer")  # fmt: skip
    bare, normed = (
        ConformerEncoder(**kwargs, final_norm="none"),
        ConformerEncoder(**kwargs, final_norm=final_norm),
    )
    rng = np.random.default_rng(2)
    features = rng.standard_normal((2, 60, 80)).astype(np.float32)
    lengths = np.array([60, 37])
    raw, frames = bare(features, lengths)
    normed(features, lengths)
    norm = normed.blocks[0].out_norm if final_norm == "block" else normed.norm
    assert (normed.norm is None) == (final_norm == "block")
    assert all((b.out_norm is None) == (final_norm != "block") for b in normed.blocks)
    gamma = rng.uniform(0.5, 1.5, 16).astype(np.float32)
    beta = rng.normal(0, 0.3, 16).astype(np.float32)
    norm.gamma.assign(gamma)
    norm.beta.assign(beta)
    for source, target in zip(bare.blocks[0].weights, normed.blocks[0].weights, strict=False):
        target.assign(source)
    normed.subsampling.set_weights(bare.subsampling.get_weights())
    got, _ = normed(features, lengths)
    raw, got, frames = raw.numpy(), got.numpy(), frames.numpy()
    for b, n in enumerate(frames):
        want = _layer_norm(raw[b, :n], gamma, beta, norm.epsilon)
        np.testing.assert_allclose(got[b, :n], want, atol=1e-4)
        assert not np.any(got[b, n:])
    assert not np.allclose(got, raw, atol=1e-2)


def test_final_norm_must_be_known():
    with pytest.raises(ValueError, match="final_norm"):
        ConformerEncoder(**TINY, final_norm="post")


def _numpy_chunked_depthwise(h, kernel, bias, chunk):
    """The centred depthwise convolution, tap by tap, leaving out frames past each output
    frame's chunk (and outside the utterance)."""
    batch, frames, _ = h.shape
    size = kernel.shape[0]
    left = (size - 1) // 2
    out = np.tile(bias, (batch, frames, 1)).astype(np.float64)
    for t in range(frames):
        end = (t // chunk + 1) * chunk  # first frame of the next chunk
        for i in range(size):
            s = t + i - left
            if 0 <= s < frames and s < end:
                out[:, t] += h[:, s] * kernel[i, :, 0]
    return out


@pytest.mark.parametrize(("size", "chunk"), [(5, 3), (7, 4), (4, 2), (15, 8), (5, 1)])
def test_the_chunked_convolution_sees_its_kernel_up_to_its_chunks_end(size, chunk):
    keras.utils.set_random_seed(7)
    rng = np.random.default_rng(size)
    x = rng.standard_normal((2, 19, 8)).astype(np.float32)
    lengths = np.array([19, 13])
    module = ConvolutionModule(d_model=8, kernel_size=size, norm="layer", dropout=0.0,
                               context="chunk")  # fmt: skip
    module(x, lengths, chunk=chunk)  # builds it
    module.depthwise.bias.assign(rng.standard_normal(8).astype(np.float32))
    got = module(x, lengths, chunk=chunk).numpy()
    h = module._gated(x).numpy() * (np.arange(19)[None, :, None] < lengths[:, None, None])
    kernel, bias = module.depthwise.kernel.numpy(), module.depthwise.bias.numpy()
    depthwise = _numpy_chunked_depthwise(h, kernel, bias, chunk).astype(np.float32)
    want = module._finish(tf.constant(depthwise), False).numpy()
    np.testing.assert_allclose(got, want, atol=1e-5)
    # A chunk longer than the utterance: the plain centred convolution, same weights.
    plain = ConvolutionModule(d_model=8, kernel_size=size, norm="layer", dropout=0.0,
                              context="full")  # fmt: skip
    plain(x, lengths)
    plain.set_weights(module.get_weights())
    np.testing.assert_allclose(
        module(x, lengths, chunk=100).numpy(), plain(x, lengths).numpy(), atol=1e-5
    )
    if size > 2 and chunk < 19:
        assert not np.allclose(got, plain(x, lengths).numpy(), atol=1e-3)


TINY = dict(d_model=16, num_blocks=1, num_heads=2, kernel_size=5, dropout=0.0,
            subsampling_filters=8, conv_norm="layer")  # fmt: skip


def test_a_module_context_and_an_encoder_conv_context_must_be_known():
    with pytest.raises(ValueError, match="context must be one of"):
        ConvolutionModule(d_model=8, kernel_size=5, norm="layer", dropout=0.0, context="both")
    with pytest.raises(ValueError, match="conv_context"):
        ConformerEncoder(**TINY, final_norm="none", conv_context="future")


@pytest.mark.parametrize(
    "options",
    [
        dict(conv_context="chunk"),
        dict(attention="relative", xscaling=True, norm_epsilon=1e-5, conv_context="causal"),
        dict(conv_context="chunk", adapter_dim=4),
    ],
    ids=["rotary", "relative positions, xscaling", "linear adapters"],
)
def test_an_encoder_fed_in_pieces_gives_the_whole_utterances_frames(options):
    """stream() / finish_stream() over feature pieces of uneven sizes (the caller keeps the
    features its subsampling has not used, as the streaming decoder does) = one call on the
    whole utterance, under either attention."""
    keras.utils.set_random_seed(8)
    encoder = ConformerEncoder(d_model=16, num_blocks=2, num_heads=2, kernel_size=5,
                               dropout=0.0, subsampling_filters=8, conv_norm="layer",
                               final_norm="block", chunk_frames=3, left_chunks=1,
                               **options)  # fmt: skip
    features = np.random.default_rng(2).standard_normal((1, 137, 80)).astype(np.float32)
    whole, lengths = encoder(features, np.array([137]))
    for block in encoder.blocks if options.get("adapter_dim") else ():  # a trained adapter
        up = block.adapter.up.kernel
        up.assign(0.3 * np.random.default_rng(5).standard_normal(up.shape).astype(np.float32))
    whole, lengths = encoder(features, np.array([137]))
    state, waiting, pieces, start = encoder.initial_stream_state(1), features[:, :0], [], 0
    for size in (5, 1, 30, 0, 17, 44, 40):
        waiting = np.concatenate([waiting, features[:, start : start + size]], axis=1)
        start += size
        out, state = encoder.stream(tf.constant(waiting), state)
        pieces.append(out.numpy())
        waiting = waiting[:, 4 * int(encoder_frames(waiting.shape[1])) :]
    pieces.append(encoder.finish_stream(state)[0].numpy())
    got = np.concatenate(pieces, axis=1)
    assert got.shape[1] == int(lengths[0])
    np.testing.assert_allclose(got, whole.numpy()[:, : got.shape[1]], atol=2e-5)
