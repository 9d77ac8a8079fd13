"""The TDT loss against independent expectations: NeMo's own PyTorch reference (committed
fixtures, `tools/make_nemo_fixtures.py`), a float64 brute force over every alignment, and
the fused (chunked) loss against the whole-logits one."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf

from asrkit.losses import fused_tdt_loss, tdt_loss

NEMO = np.load(Path(__file__).resolve().parents[1] / "data/nemo/tdt_losses.npz")


def _from_nemo(name):
    """A NeMo fixture case in asrkit's layout: blank first, label ids + 1."""
    acts, durations = NEMO[f"{name}/acts"], NEMO[f"{name}/durations"]
    v = acts.shape[-1] - len(durations)
    tokens = np.concatenate([acts[..., v - 1 : v], acts[..., : v - 1]], axis=-1)
    return tokens, acts[..., v:], NEMO[f"{name}/labels"] + 1, v


@pytest.mark.parametrize("name", ["small", "sigma", "no_zero"])
def test_losses_and_gradients_equal_nemos_reference(name):
    tokens, dur_logits, labels, v = _from_nemo(name)
    durations = NEMO[f"{name}/durations"].tolist()
    tokens, dur_logits = tf.constant(tokens), tf.constant(dur_logits)
    with tf.GradientTape() as tape:
        tape.watch([tokens, dur_logits])
        losses = tdt_loss(tokens, dur_logits, labels, NEMO[f"{name}/act_lens"],
                          NEMO[f"{name}/label_lens"], durations=durations,
                          sigma=float(NEMO[f"{name}/sigma"]))  # fmt: skip
        total = tf.reduce_sum(losses)
    np.testing.assert_allclose(losses.numpy(), NEMO[f"{name}/losses"], rtol=1e-5)
    d_tokens, d_dur = tape.gradient(total, [tokens, dur_logits])
    want = NEMO[f"{name}/grad"]
    want_tokens = np.concatenate([want[..., v - 1 : v], want[..., : v - 1]], axis=-1)
    np.testing.assert_allclose(d_tokens.numpy(), want_tokens, atol=1e-5)
    np.testing.assert_allclose(d_dur.numpy(), want[..., v:], atol=1e-5)


def _brute_force(log_tokens, log_dur, labels, frames, durations, sigma):
    """log P(y|x) in float64 by enumerating every (symbol, duration) sequence."""
    u_total = len(labels)
    total = -np.inf

    def walk(t, u, score):
        nonlocal total
        for k, d in enumerate(durations):
            if d > 0 and t + d <= frames:  # a blank
                s = score + log_tokens[t, u, 0] - sigma + log_dur[t, u, k]
                if t + d == frames:
                    if u == u_total:
                        total = np.logaddexp(total, s)
                else:
                    walk(t + d, u, s)
            if u < u_total and t + d < frames:  # the next label
                walk(t + d, u + 1, score + log_tokens[t, u, labels[u]] - sigma + log_dur[t, u, k])

    walk(0, 0, 0.0)
    return total


@pytest.mark.parametrize(
    ("frames", "u", "durations"),
    [(4, 2, [0, 1, 2]), (5, 1, [1, 2]), (3, 3, [0, 1]), (6, 2, [0, 2, 3])],
)
def test_the_loss_is_minus_the_log_sum_over_every_alignment(frames, u, durations):
    rng = np.random.default_rng(frames * 10 + u)
    v, sigma = 4, 0.03
    tokens = rng.standard_normal((2, frames + 1, u + 2, v))  # padded frames and labels
    dur_logits = rng.standard_normal((2, frames + 1, u + 2, len(durations)))
    labels = rng.integers(1, v, (2, u + 1))
    lengths, label_lengths = np.array([frames, frames - 1]), np.array([u, max(u - 1, 0)])
    got = tdt_loss(tf.constant(tokens, tf.float32), tf.constant(dur_logits, tf.float32),
                   labels, lengths, label_lengths, durations=durations,
                   sigma=sigma).numpy()  # fmt: skip
    log_tokens = tokens - np.log(np.exp(tokens).sum(-1, keepdims=True))
    log_dur = dur_logits - np.log(np.exp(dur_logits).sum(-1, keepdims=True))
    for b in range(2):
        want = -_brute_force(log_tokens[b], log_dur[b], labels[b, : label_lengths[b]],
                             lengths[b], durations, sigma)  # fmt: skip
        if np.isinf(want):
            assert np.isinf(got[b]) and got[b] > 0
        else:
            np.testing.assert_allclose(got[b], want, rtol=1e-5)


def test_an_utterance_no_durations_can_align_has_an_infinite_loss():
    """Only even durations and an odd frame count: no path ends on frame T."""
    tokens = tf.random.stateless_normal([2, 5, 3, 4], [1, 2])
    dur_logits = tf.random.stateless_normal([2, 5, 3, 2], [3, 4])
    losses = tdt_loss(tokens, dur_logits, [[1, 2], [1, 2]], [5, 4], [2, 2], durations=[0, 2])
    assert np.isinf(losses.numpy()[0]) and losses.numpy()[0] > 0
    assert np.isfinite(losses.numpy()[1])  # 4 frames: 2 + 2
    with tf.GradientTape() as tape:
        tape.watch(tokens)
        total = tdt_loss(tokens, dur_logits, [[1, 2], [1, 2]], [5, 4], [2, 2], durations=[0, 2])[1]
    assert np.isfinite(tape.gradient(total, tokens).numpy()).all()


@pytest.mark.parametrize("durations", [(0, 1, 2, 3, 4), (1, 2), (0, 2, 3)])
def test_the_written_gradient_equals_autodiff_through_the_forward_recursion(durations):
    """The beta recursion and arc posteriors against TensorFlow's gradient of the alpha
    recursion itself, on a padded batch (frames 9, 6, 1, 4; labels 3, 0, 0, 2) with the
    impossible one of (0, 2, 3) too."""
    from asrkit.losses import tdt

    rng = np.random.default_rng(len(durations))
    lengths, label_lengths = tf.constant([9, 6, 1, 4]), tf.constant([3, 0, 0, 2])
    inputs = [tf.constant(rng.normal(-1.5, 1.0, shape), tf.float32)
              for shape in ((9, 4, 4), (9, 4, 4), (9, 4, 4, len(durations)))]  # fmt: skip
    upstream = tf.constant([1.0, -0.5, 2.0, 0.7])
    with tf.GradientTape(persistent=True) as tape:
        tape.watch(inputs)
        written = tdt._log_prob(*inputs, lengths, label_lengths, durations)
        alpha = tdt._alphas(*inputs, durations)
        autodiff = tdt._terminal(alpha, inputs[0], inputs[2], lengths, label_lengths, durations)
        possible = autodiff > tdt.LOG_ZERO / 2
        weighted = [
            tf.reduce_sum(tf.where(possible, upstream * x, 0.0)) for x in (written, autodiff)
        ]
    np.testing.assert_allclose(written.numpy(), autodiff.numpy(), rtol=1e-6)
    for mine, want in zip(tape.gradient(weighted[0], inputs), tape.gradient(weighted[1], inputs),
                          strict=True):  # fmt: skip
        np.testing.assert_allclose(mine.numpy(), want.numpy(), atol=2e-5)
    assert np.abs(want.numpy()).max() > 0.05


def _joint_case(seed, batch=3, frames=11, max_u=4, hidden=12, vocab=20, durations=5):
    rng = np.random.default_rng(seed)
    enc = tf.constant(rng.standard_normal((batch, frames, hidden)), tf.float32)
    pred = tf.constant(rng.standard_normal((batch, max_u + 1, hidden)), tf.float32)
    weights = [
        tf.Variable(rng.standard_normal((hidden, vocab)).astype(np.float32) * 0.4),
        tf.Variable(rng.standard_normal(vocab).astype(np.float32) * 0.1),
        tf.Variable(rng.standard_normal((hidden, durations)).astype(np.float32) * 0.4),
        tf.Variable(rng.standard_normal(durations).astype(np.float32) * 0.1),
    ]
    labels = rng.integers(1, vocab, (batch, max_u))
    lengths = np.array([frames, frames - 3, 2][:batch])
    label_lengths = np.array([max_u, 2, 0][:batch])
    return enc, pred, weights, labels, lengths, label_lengths


@pytest.mark.parametrize(("activation", "chunk_bytes"), [("tanh", 1), ("relu", 3000),
                                                         ("tanh", 2**26)])  # fmt: skip
def test_the_fused_loss_equals_the_whole_logits_loss_and_its_gradients(activation, chunk_bytes):
    enc, pred, (kernel, bias, dkernel, dbias), labels, lengths, label_lengths = _joint_case(3)
    act = tf.nn.relu if activation == "relu" else tf.tanh
    durations, sigma = [0, 1, 2, 3, 4], 0.05
    weighting = tf.constant([1.0, -0.5, 2.0])
    results = []
    for fused in (False, True):
        with tf.GradientTape() as tape:
            tape.watch([enc, pred])
            if fused:
                losses = fused_tdt_loss(enc, pred, labels, lengths, label_lengths, kernel=kernel,
                                        bias=bias, duration_kernel=dkernel, duration_bias=dbias,
                                        durations=durations, sigma=sigma,
                                        chunk_bytes=chunk_bytes, activation=activation)  # fmt: skip
            else:
                hidden = act(enc[:, :, None, :] + pred[:, None, :, :])
                losses = tdt_loss(hidden @ kernel + bias, hidden @ dkernel + dbias, labels,
                                  lengths, label_lengths, durations=durations,
                                  sigma=sigma)  # fmt: skip
            total = tf.reduce_sum(losses * weighting)
        results.append([losses, *tape.gradient(total, [enc, pred, kernel, bias, dkernel, dbias])])
    for got, want in zip(results[1], results[0], strict=True):
        np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-4, atol=1e-5)
    assert not np.any(results[1][1].numpy()[1, -3:])  # padded frames: no gradient


def test_xla_compiles_the_fused_loss_to_the_same_values():
    enc, pred, weights, labels, lengths, label_lengths = _joint_case(4)

    def run(enc, pred):
        kernel, bias, dkernel, dbias = weights
        return fused_tdt_loss(enc, pred, labels, lengths, label_lengths, kernel=kernel,
                              bias=bias, duration_kernel=dkernel, duration_bias=dbias,
                              chunk_bytes=4000)  # fmt: skip

    eager = run(enc, pred)
    compiled = tf.function(run, jit_compile=True, autograph=False)(enc, pred)
    np.testing.assert_allclose(compiled.numpy(), eager.numpy(), rtol=1e-5)


def test_brute_force_enumeration_is_itself_right_on_a_hand_case():
    """T = 2, U = 1, durations [1, 2]: the alignments are (label d1, blank d1) and (blank
    d1, ...) cannot end with the label; enumerate them by hand."""
    lt = np.log(np.full((2, 2, 2), 0.5))
    ld = np.log(np.full((2, 2, 2), 0.5))
    # label at t=0 with d=1 -> (1, 1); blank d=1 -> T: 0.5*0.5 * 0.5*0.5
    # label at t=0 with d=2 lands on T: not allowed; blank first then label at t=1 lands on
    # T or beyond: not allowed.
    want = np.log(0.25 * 0.25)
    got = _brute_force(lt, ld, [1], 2, [1, 2], 0.0)
    assert got == pytest.approx(want)


def test_a_tdt_task_with_omega_one_trains_the_rnnt_loss_of_the_token_logits():
    """omega = 1: every update takes the RNN-T loss of the token logits (NeMo's omega
    sampling, always on), exactly the `full` loss of the same network."""
    import dataclasses

    from asrkit.config import LossConfig
    from asrkit.models.transducer import Transducer
    from asrkit.training.task import TransducerTask
    from tests.tiny import tiny_model_config

    config = dataclasses.replace(tiny_model_config(), durations=(0, 1, 2))
    network = Transducer(9, config)
    rng = np.random.default_rng(0)
    batch = (rng.standard_normal((2, 40, 80)).astype(np.float32), np.array([40, 31]),
             np.array([[1, 2, 3], [4, 5, 0]]), np.array([3, 2]))  # fmt: skip
    got = TransducerTask(network, LossConfig(kind="tdt", omega=1.0)).compute_loss_terms(batch)
    want = TransducerTask(network, LossConfig(kind="full")).compute_loss_terms(batch)
    assert float(got[0]) == pytest.approx(float(want[0]), rel=1e-6)
    tdt = TransducerTask(network, LossConfig(kind="tdt")).compute_loss_terms(batch)
    assert abs(float(tdt[0]) - float(want[0])) > 0.1  # the TDT loss is another loss
