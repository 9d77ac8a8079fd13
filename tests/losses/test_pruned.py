"""Pruned RNN-T against independent expectations: the simple loss is the full loss of the
trivial joiner, with S >= U+1 the pruned loss is the full loss, bands obey their bounds."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from asrkit.losses import (
    fused_pruned_loss,
    fused_simple_loss,
    loss_scales,
    prune_ranges,
    pruned_loss,
    rnnt_loss,
    simple_loss,
)

B, T, U, H, V = 3, 12, 5, 8, 11
FRAMES = np.array([12, 9, 4], np.int32)
LABEL_LENGTHS = np.array([5, 3, 0], np.int32)


def _pruned(enc, pred, output, labels, s_begin, span, fused=False, **settings):
    """The pruned loss (or its fused twin) of the joint whose output layer is `output`."""
    loss = fused_pruned_loss if fused else pruned_loss
    if not fused:
        settings.pop("chunk_bytes", None)  # the plain loss has no chunks
    return loss(enc, pred, labels, FRAMES, LABEL_LENGTHS, s_begin=s_begin, prune_range=span,
                kernel=output.kernel, bias=output.bias, **settings)  # fmt: skip


def _labels(rng):
    return tf.constant(rng.integers(1, V, (B, U)), tf.int32)


def test_simple_loss_is_the_full_loss_of_the_trivial_joiner():
    rng = np.random.default_rng(0)
    am = tf.constant(rng.standard_normal((B, T, V)) * 2, tf.float32)
    lm = tf.constant(rng.standard_normal((B, U + 1, V)) * 2, tf.float32)
    labels = _labels(rng)
    with tf.GradientTape(persistent=True) as tape:
        tape.watch([am, lm])
        got, occupancy = simple_loss(am, lm, labels, FRAMES, LABEL_LENGTHS)
        want = rnnt_loss(am[:, :, None] + lm[:, None], labels, FRAMES, LABEL_LENGTHS)
        weights = tf.constant([1.0, 0.5, -2.0])
        got_total, want_total = tf.reduce_sum(got * weights), tf.reduce_sum(want * weights)
    np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-5)
    for a, b in zip(tape.gradient(got_total, [am, lm]), tape.gradient(want_total, [am, lm]),
                    strict=True):  # fmt: skip
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-4, atol=1e-5)
    # Occupancy: every path passes through exactly one node per diagonal step; summed
    # over the lattice it is T_b + U_b nodes' worth.
    np.testing.assert_allclose(np.sum(occupancy.numpy(), axis=(1, 2)), FRAMES + LABEL_LENGTHS,
                               rtol=1e-4)  # fmt: skip


def _smoothed_reference(am, lm, labels, lm_only, am_only):
    """NumPy float64: the blank / next-label log-probs of k2's smoothed simple loss."""
    am, lm = am.astype(np.float64), lm.astype(np.float64)
    log_softmax = lambda x: x - np.log(np.exp(x).sum(-1, keepdims=True))  # noqa: E731
    full = log_softmax(am[:, :, None] + lm[:, None])  # [B, T, U+1, V]
    lm_lp = log_softmax(lm)  # [B, U+1, V]
    rows = [(b, u) for b in range(B) for u in range(LABEL_LENGTHS[b] + 1)]
    unigram = np.mean([np.exp(lm_lp[b, u]) for b, u in rows], axis=0)
    am_lp = log_softmax(am + np.log(unigram))  # [B, T, V]
    mix = (1 - lm_only - am_only) * full + lm_only * lm_lp[:, None] + am_only * am_lp[:, :, None]
    out = np.zeros((B, T, U + 1, V))
    for b in range(B):
        for u in range(U + 1):
            out[b, :, u, 0] = mix[b, :, u, 0]
            if u < LABEL_LENGTHS[b]:
                out[b, :, u, labels[b, u]] = mix[b, :, u, labels[b, u]]
    return out


@pytest.mark.parametrize(("lm_only", "am_only"), [(0.25, 0.0), (0.1, 0.2)])
def test_smoothed_simple_loss_matches_a_numpy_reference(lm_only, am_only):
    rng = np.random.default_rng(1)
    am = rng.standard_normal((B, T, V)).astype(np.float32)
    lm = rng.standard_normal((B, U + 1, V)).astype(np.float32)
    labels = np.stack([rng.permutation(np.arange(1, V))[:U] for _ in range(B)]).astype(np.int32)
    got, _ = simple_loss(
        am, lm, labels, FRAMES, LABEL_LENGTHS, lm_only_scale=lm_only, am_only_scale=am_only
    )
    # rnnt_loss on log-probs (no log-softmax) reads exactly the blank and label entries.
    log_probs = _smoothed_reference(am, lm, labels, lm_only, am_only)
    want = rnnt_loss(log_probs.astype(np.float32), labels, FRAMES, LABEL_LENGTHS,
                     fused_log_softmax=False)  # fmt: skip
    np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-4)
    plain, _ = simple_loss(am, lm, labels, FRAMES, LABEL_LENGTHS)
    assert not np.allclose(got.numpy(), plain.numpy())


@pytest.mark.parametrize(("lm_only", "am_only"), [(0.0, 0.0), (0.25, 0.0), (0.1, 0.2)])
@pytest.mark.parametrize("chunk_bytes", [1, 3000, 2**26])  # 1 frame, a few, all at once
def test_the_fused_simple_loss_gives_the_plain_loss_occupancy_and_gradients(
    chunk_bytes, lm_only, am_only
):
    """am = encoded @ kernel + bias chunk by chunk (never whole) = the projection made
    first and `simple_loss` on it: losses, occupancy, and the gradients of the encoder
    frames, the projection's kernel and bias and the predictor part, padding included."""
    rng = np.random.default_rng(6)
    encoded = tf.constant(rng.standard_normal((B, T, H)), tf.float32)
    lm = tf.constant(rng.standard_normal((B, U + 1, V)) * 2, tf.float32)
    labels = _labels(rng)
    keras.utils.set_random_seed(6)
    projection = keras.layers.Dense(V)
    projection.build((None, H))
    kernel, bias = projection.kernel, projection.bias
    weights = tf.constant([1.0, -0.5, 2.0])
    results = []
    for fused in (False, True):
        with tf.GradientTape() as tape:
            tape.watch([encoded, lm])
            if fused:
                losses, occupancy = fused_simple_loss(
                    encoded, lm, labels, FRAMES, LABEL_LENGTHS, kernel=kernel, bias=bias,
                    lm_only_scale=lm_only, am_only_scale=am_only, chunk_bytes=chunk_bytes,
                )  # fmt: skip
            else:
                losses, occupancy = simple_loss(
                    projection(encoded), lm, labels, FRAMES, LABEL_LENGTHS,
                    lm_only_scale=lm_only, am_only_scale=am_only,
                )  # fmt: skip
            total = tf.reduce_sum(losses * weights)
        gradients = tape.gradient(total, [encoded, lm, kernel, bias])
        results.append([losses, occupancy, *gradients])
    for got, want in zip(results[1], results[0], strict=True):
        np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-4, atol=1e-5)
    assert np.abs(results[0][2].numpy()).max() > 1e-2  # the encoder does get a gradient


def _joint_case(seed):
    rng = np.random.default_rng(seed)
    enc = tf.constant(rng.standard_normal((B, T, H)), tf.float32)
    pred = tf.constant(rng.standard_normal((B, U + 1, H)), tf.float32)
    keras.utils.set_random_seed(seed)
    output = keras.layers.Dense(V)
    output.build((None, H))
    return enc, pred, output, _labels(rng)


def _full(enc, pred, output, labels):
    logits = output(tf.tanh(enc[:, :, None] + pred[:, None]))
    return rnnt_loss(logits, labels, FRAMES, LABEL_LENGTHS)


def test_pruned_with_a_band_of_u_plus_1_is_the_full_loss():
    enc, pred, output, labels = _joint_case(2)
    s_begin = tf.zeros([B, T], tf.int32)
    with tf.GradientTape(persistent=True) as tape:
        tape.watch([enc, pred])
        got = _pruned(enc, pred, output, labels, s_begin, U + 1)
        want = _full(enc, pred, output, labels)
        got_total, want_total = tf.reduce_sum(got), tf.reduce_sum(want)
    np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-5)
    variables = [enc, pred, *output.trainable_variables]
    for a, b in zip(tape.gradient(got_total, variables), tape.gradient(want_total, variables),
                    strict=True):  # fmt: skip
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("chunk_bytes", [1, 3000, 2**26])  # 1 frame, a few, all at once
def test_the_fused_band_gives_the_plain_bands_loss_and_gradients(chunk_bytes):
    """Chunk by chunk without the band's logits (`fused=True`) = the band's whole
    log-softmax, for a narrow band chosen by the simple loss and for one covering the
    lattice (= the full loss), padding rows and frames included."""
    enc, pred, output, labels = _joint_case(5)
    am = tf.random.stateless_normal([B, T, V], [1, 9])
    lm = tf.random.stateless_normal([B, U + 1, V], [2, 9])
    _, occupancy = simple_loss(am, lm, labels, FRAMES, LABEL_LENGTHS)
    weights = tf.constant([1.0, -0.5, 2.0])
    for span in (3, U + 1):
        s_begin = prune_ranges(occupancy, FRAMES, LABEL_LENGTHS, prune_range=span)
        results = []
        for fused in (False, True):
            with tf.GradientTape() as tape:
                tape.watch([enc, pred])
                losses = _pruned(enc, pred, output, labels, s_begin, span, fused=fused,
                                 chunk_bytes=chunk_bytes)  # fmt: skip
                total = tf.reduce_sum(losses * weights)
            variables = [enc, pred, *output.trainable_variables]
            results.append([losses, *tape.gradient(total, variables)])
        for got, want in zip(results[1], results[0], strict=True):
            np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(results[1][0].numpy(), _full(enc, pred, output, labels).numpy(),
                               rtol=1e-5)  # fmt: skip


def test_a_narrow_band_keeps_fewer_paths_so_the_loss_can_only_grow():
    enc, pred, output, labels = _joint_case(3)
    am = tf.random.stateless_normal([B, T, V], [1, 2])
    lm = tf.random.stateless_normal([B, U + 1, V], [3, 4])
    _, occupancy = simple_loss(am, lm, labels, FRAMES, LABEL_LENGTHS)
    full = _full(enc, pred, output, labels).numpy()
    for span in (2, 3, 4):
        s_begin = prune_ranges(occupancy, FRAMES, LABEL_LENGTHS, prune_range=span)
        pruned = _pruned(enc, pred, output, labels, s_begin, span)
        assert np.all(np.isfinite(pruned.numpy()))  # the band always holds a whole path
        assert np.all(pruned.numpy() >= full - 1e-4)


@pytest.mark.parametrize("span", [2, 3, 5, 6, 9])
def test_prune_ranges_are_monotone_gap_free_and_anchored(span):
    rng = np.random.default_rng(span)
    occupancy = tf.constant(rng.random((B, T, U + 1)), tf.float32)
    s_begin = prune_ranges(occupancy, FRAMES, LABEL_LENGTHS, prune_range=span).numpy()
    for b in range(B):
        s = s_begin[b, : FRAMES[b]]
        width = min(span, U + 1)
        assert s[0] == 0
        assert np.all(np.diff(s) >= 0) and np.all(np.diff(s) <= width - 1)
        assert np.all(s <= max(LABEL_LENGTHS[b] + 1 - width, 0))
        assert s[-1] + width - 1 >= LABEL_LENGTHS[b]  # the last frame reaches U_b


def test_prune_ranges_follow_the_occupancy():
    """An occupancy that is one clean staircase path: every frame's band contains it."""
    path = [0, 0, 1, 1, 2, 2, 3, 4, 4, 5, 5, 5]  # row per frame, steps <= 1
    occupancy = np.zeros((B, T, U + 1), np.float32)
    occupancy[:, np.arange(T), path] = 1.0
    s_begin = prune_ranges(occupancy, np.full(B, T), np.full(B, U), prune_range=3).numpy()
    for t, row in enumerate(path):
        assert np.all((s_begin[:, t] <= row) & (row < s_begin[:, t] + 3))


def test_loss_weights_warm_up_over_updates():
    for updates, simple, pruned in [(0, 1.0, 0.1), (1000, 0.75, 0.55), (2000, 0.5, 1.0),
                                    (9000, 0.5, 1.0)]:  # fmt: skip
        got = loss_scales(updates, 2000, 0.5)
        assert float(got[0]) == pytest.approx(simple) and float(got[1]) == pytest.approx(pruned)


def test_the_whole_pruned_recipe_compiles_with_xla_and_matches_eager():
    enc, pred, output, labels = _joint_case(4)
    am = tf.random.stateless_normal([B, T, V], [5, 6])
    lm = tf.random.stateless_normal([B, U + 1, V], [7, 8])

    def losses(enc, pred, am, lm):
        scales = dict(lm_only_scale=0.25, am_only_scale=0.1)
        simple, occupancy = simple_loss(am, lm, labels, FRAMES, LABEL_LENGTHS, **scales)
        s_begin = prune_ranges(occupancy, FRAMES, LABEL_LENGTHS, prune_range=3)
        pruned = _pruned(enc, pred, output, labels, s_begin, 3)
        fused = _pruned(enc, pred, output, labels, s_begin, 3, fused=True, chunk_bytes=3000)
        kernel, bias = output.kernel[:, :V], output.bias  # any projection to V will do
        fused_simple, _ = fused_simple_loss(enc, lm, labels, FRAMES, LABEL_LENGTHS,
                                            kernel=kernel, bias=bias, chunk_bytes=3000,
                                            **scales)  # fmt: skip
        return simple + fused_simple, pruned + 0.5 * fused

    def with_grads(*args):
        with tf.GradientTape() as tape:
            tape.watch(args)
            simple, pruned = losses(*args)
            total = tf.reduce_sum(0.5 * simple + pruned)
        return simple, pruned, tape.gradient(total, args)

    eager = with_grads(enc, pred, am, lm)
    compiled = tf.function(with_grads, jit_compile=True, autograph=False)(enc, pred, am, lm)
    for got, want in zip(tf.nest.flatten(compiled), tf.nest.flatten(eager), strict=True):
        np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-4, atol=1e-5)


def test_a_relu_joint_band_fused_or_not_gives_the_same_loss_and_gradients():
    enc, pred, output, labels = _joint_case(6)
    s_begin = tf.zeros([B, T], tf.int32)
    results = []
    for fused in (False, True):
        with tf.GradientTape() as tape:
            tape.watch([enc, pred])
            losses = _pruned(enc, pred, output, labels, s_begin, U + 1, fused=fused,
                             chunk_bytes=3000, activation="relu")  # fmt: skip
            total = tf.reduce_sum(losses)
        results.append([losses, *tape.gradient(total, [enc, pred, *output.trainable_variables])])
    for got, want in zip(results[1], results[0], strict=True):
        np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-4, atol=1e-6)
    # a band covering the lattice is the full loss of the relu joint
    logits = output(tf.nn.relu(enc[:, :, None, :] + pred[:, None, :, :]))
    np.testing.assert_allclose(results[1][0].numpy(), rnnt_loss(logits, labels, FRAMES,
                               LABEL_LENGTHS).numpy(), rtol=1e-5)  # fmt: skip
