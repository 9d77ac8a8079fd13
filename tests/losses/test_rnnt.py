"""RNN-T loss against torchaudio/float64 golden vectors and brute-force NumPy references."""

import functools
import json

import numpy as np
import pytest
import tensorflow as tf
from hypothesis import given, settings
from hypothesis import strategies as st

from asrkit.losses import RNNTLoss, rnnt_loss
from tests.losses.reference import brute_force_loss, dp_loss

GRAPH = functools.partial(tf.function, autograph=False)  # as asrkit traces its graphs

GOLDEN_CASES = [
    "basic_blank0",
    "varlen_pad_blank0",
    "varlen_pad_blank_last",
    "empty_labels_u0",
    "t1",
    "large_v",
    "large_v_blank_last",
    "peaky_logits",
    "long",
    "logprobs_input_unfused",
]


def loss_and_grad(logits, labels, logit_lengths, label_lengths, blank=0, fused=True, fn=None):
    logits = tf.convert_to_tensor(logits)

    def compute(x, y, xl, yl):
        with tf.GradientTape() as tape:
            tape.watch(x)
            losses = rnnt_loss(x, y, xl, yl, blank=blank, fused_log_softmax=fused)
            total = tf.reduce_sum(losses)
        return losses, tape.gradient(total, x)

    run = fn(compute) if fn else compute
    losses, grad = run(logits, tf.constant(labels, tf.int32), logit_lengths, label_lengths)
    return losses.numpy(), grad.numpy()


def random_case(rng, batch=3, frames=7, max_u=4, vocab=6, blank=0, scale=2.0):
    logits = (rng.standard_normal((batch, frames, max_u + 1, vocab)) * scale).astype(np.float32)
    logit_lengths = rng.integers(1, frames + 1, size=batch).astype(np.int32)
    logit_lengths[0] = frames
    label_lengths = rng.integers(0, max_u + 1, size=batch).astype(np.int32)
    label_lengths[-1] = max_u
    non_blank = [v for v in range(vocab) if v != blank]
    labels = rng.choice(non_blank, size=(batch, max_u)).astype(np.int32)
    return logits, labels, logit_lengths, label_lengths


def test_golden_file_is_the_expected_one(golden):
    meta = json.loads(str(golden["meta_json"]))
    assert meta["torchaudio"].startswith("2.9.1")
    assert sorted(str(c) for c in golden["case_names"]) == sorted(GOLDEN_CASES)


@pytest.mark.parametrize("case", GOLDEN_CASES)
def test_matches_golden_losses_and_gradients(golden, case):
    def field(name):
        return golden[f"{case}__{name}"]

    losses, grad = loss_and_grad(
        field("logits"),
        field("labels"),
        field("logit_lengths"),
        field("label_lengths"),
        blank=int(field("blank")),
        fused=bool(field("fused_log_softmax")),
    )
    want_losses, want_grad = field("losses_ref64"), field("grads_ref64")
    assert losses.dtype == np.float32
    assert np.max(np.abs(losses - want_losses) / np.abs(want_losses)) <= float(field("loss_rtol"))
    assert np.max(np.abs(grad - want_grad)) / np.max(np.abs(want_grad)) <= float(field("grad_tol"))
    # Outside each utterance's lattice the reference gradient is exactly zero, and so is ours.
    assert np.all(grad[want_grad == 0] == 0) or not np.any(want_grad == 0)


@pytest.mark.parametrize("blank", [0, 3])
def test_matches_brute_force_sum_over_alignments(blank):
    rng = np.random.default_rng(7 + blank)
    logits, labels, logit_lengths, label_lengths = random_case(
        rng, batch=3, frames=4, max_u=3, vocab=5, blank=blank
    )
    losses, _ = loss_and_grad(logits, labels, logit_lengths, label_lengths, blank=blank)
    for b in range(3):
        want = brute_force_loss(
            logits[b], labels[b], logit_lengths[b], label_lengths[b], blank=blank
        )
        np.testing.assert_allclose(losses[b], want, rtol=2e-6)


@pytest.mark.parametrize("fused", [True, False])
def test_gradient_matches_finite_differences_of_brute_force(fused):
    rng = np.random.default_rng(3)
    logits, labels, logit_lengths, label_lengths = random_case(
        rng, batch=1, frames=3, max_u=2, vocab=4, blank=0, scale=1.0
    )
    if not fused:  # the unfused loss expects log-probabilities
        logits = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    _, grad = loss_and_grad(logits, labels, logit_lengths, label_lengths, fused=fused)
    x = logits[0].astype(np.float64)
    numeric = np.zeros_like(x)
    eps = 1e-6
    for idx in np.ndindex(x.shape):
        plus, minus = x.copy(), x.copy()
        plus[idx] += eps
        minus[idx] -= eps
        args = (labels[0], logit_lengths[0], label_lengths[0], 0, fused)
        numeric[idx] = (brute_force_loss(plus, *args) - brute_force_loss(minus, *args)) / (2 * eps)
    np.testing.assert_allclose(grad[0], numeric, atol=2e-5)


@pytest.mark.parametrize("penalty", [0.05, 0.5])
def test_delay_penalty_matches_brute_force_and_its_finite_differences(penalty):
    """k2's delay-penalized lattice: each label at frame t scores λ·((T_b−1)/2 − t) more
    (T_b the utterance's own frames); loss and gradient against the enumeration."""
    rng = np.random.default_rng(11)
    logits, labels, logit_lengths, label_lengths = random_case(
        rng, batch=3, frames=4, max_u=3, vocab=5, blank=0
    )

    def penalized(x, y, xl, yl):
        with tf.GradientTape() as tape:
            tape.watch(x)
            losses = rnnt_loss(x, y, xl, yl, blank=0, delay_penalty=penalty)
            total = tf.reduce_sum(losses)
        return losses, tape.gradient(total, x)

    losses, grad = (v.numpy() for v in penalized(
        tf.constant(logits), tf.constant(labels), logit_lengths, label_lengths
    ))  # fmt: skip
    plain, _ = loss_and_grad(logits, labels, logit_lengths, label_lengths)
    changed = np.abs(losses - plain) > 1e-4
    assert np.array_equal(changed, (label_lengths > 0) & (logit_lengths > 1))  # labels, T > 1
    for b in range(3):
        args = (labels[b], logit_lengths[b], label_lengths[b], 0, True, penalty)
        np.testing.assert_allclose(losses[b], brute_force_loss(logits[b], *args), rtol=2e-6)
    b, x, eps = 0, logits[0].astype(np.float64), 1e-6
    args = (labels[b], logit_lengths[b], label_lengths[b], 0, True, penalty)
    numeric = np.zeros_like(x)
    for idx in np.ndindex(x.shape):
        plus, minus = x.copy(), x.copy()
        plus[idx] += eps
        minus[idx] -= eps
        numeric[idx] = (brute_force_loss(plus, *args) - brute_force_loss(minus, *args)) / (2 * eps)
    np.testing.assert_allclose(grad[0], numeric, atol=3e-5)


@settings(max_examples=25, deadline=None)
@given(
    seed=st.integers(0, 2**31 - 1),
    batch=st.integers(1, 3),
    frames=st.integers(1, 9),
    max_u=st.integers(0, 5),
    vocab=st.integers(2, 7),
    blank_last=st.booleans(),
)
def test_random_shapes_match_float64_dp(seed, batch, frames, max_u, vocab, blank_last):
    rng = np.random.default_rng(seed)
    blank = vocab - 1 if blank_last else 0
    logits, labels, logit_lengths, label_lengths = random_case(
        rng, batch, frames, max_u, vocab, blank=blank, scale=3.0
    )
    losses, grad = loss_and_grad(logits, labels, logit_lengths, label_lengths, blank=blank)
    for b in range(batch):
        want = dp_loss(logits[b], labels[b], logit_lengths[b], label_lengths[b], blank)
        np.testing.assert_allclose(losses[b], want, rtol=1e-5, atol=1e-5)
    # Fused gradient = softmax·occupancy − posteriors: it sums to zero over V in every cell.
    np.testing.assert_allclose(grad.sum(-1), 0.0, atol=1e-5)
    assert np.all(losses >= 0)


def test_padding_never_influences_result_and_gets_zero_gradient():
    rng = np.random.default_rng(11)
    logits, labels, logit_lengths, label_lengths = random_case(rng, 4, 9, 5, 8)
    valid = np.zeros(logits.shape, bool)
    for b in range(4):
        valid[b, : logit_lengths[b], : label_lengths[b] + 1] = True
    noisy = np.where(valid, logits, rng.standard_normal(logits.shape).astype(np.float32) * 50)
    noisy_labels = labels.copy()
    for b in range(4):
        noisy_labels[b, label_lengths[b] :] = rng.integers(0, 8, size=5 - label_lengths[b])
    clean_losses, clean_grad = loss_and_grad(logits, labels, logit_lengths, label_lengths)
    noisy_losses, noisy_grad = loss_and_grad(noisy, noisy_labels, logit_lengths, label_lengths)
    np.testing.assert_array_equal(clean_losses, noisy_losses)
    np.testing.assert_array_equal(clean_grad, noisy_grad)
    assert np.all(noisy_grad[~valid] == 0.0)
    # Each utterance alone (cropped to its own lattice) equals its row of the batch.
    for b in range(4):
        t, u = logit_lengths[b], label_lengths[b]
        alone, alone_grad = loss_and_grad(
            noisy[b : b + 1, :t, : u + 1], labels[b : b + 1, :u], [t], [u]
        )
        np.testing.assert_allclose(alone[0], noisy_losses[b], rtol=1e-6)
        np.testing.assert_allclose(alone_grad[0], noisy_grad[b, :t, : u + 1], atol=1e-7)


@pytest.mark.parametrize("shape", [(3, 12, 6, 10), (2, 1, 0, 4), (2, 1, 3, 5), (1, 4, 0, 3)])
def test_eager_graph_and_xla_agree_and_are_deterministic(shape):
    rng = np.random.default_rng(5)
    case = random_case(rng, *shape)
    eager = loss_and_grad(*case)
    graph = loss_and_grad(*case, fn=GRAPH)
    xla = loss_and_grad(*case, fn=lambda f: tf.function(f, jit_compile=True, autograph=False))
    again = loss_and_grad(*case, fn=GRAPH)
    # Grappler and XLA fuse and reorder float32 arithmetic: equal to rounding, not bitwise.
    for other in (graph, xla):
        np.testing.assert_allclose(other[0], eager[0], rtol=1e-5)
        np.testing.assert_allclose(other[1], eager[1], atol=1e-5)
    np.testing.assert_array_equal(graph[0], again[0])
    np.testing.assert_array_equal(graph[1], again[1])


@pytest.mark.parametrize("dtype", [tf.float16, tf.bfloat16])
def test_low_precision_logits_are_upcast(dtype):
    rng = np.random.default_rng(9)
    logits, labels, logit_lengths, label_lengths = random_case(rng, 2, 8, 4, 12)
    low = tf.cast(logits, dtype)
    want_losses, want_grad = loss_and_grad(
        tf.cast(low, tf.float32), labels, logit_lengths, label_lengths
    )
    with tf.GradientTape() as tape:
        tape.watch(low)
        losses = rnnt_loss(low, labels, logit_lengths, label_lengths)
        total = tf.reduce_sum(losses)
    grad = tape.gradient(total, low)
    assert losses.dtype == tf.float32
    assert grad.dtype == dtype
    np.testing.assert_allclose(losses.numpy(), want_losses, rtol=1e-6)
    tol = 1e-3 if dtype == tf.float16 else 1e-2
    np.testing.assert_allclose(tf.cast(grad, tf.float32).numpy(), want_grad, atol=tol)


@pytest.mark.parametrize("fused", [True, False])
def test_the_gradient_inside_a_tf_cond_is_the_gradient_outside(fused):
    """A TDT loss with omega picks the RNN-T loss in a tf.cond: the gradient through
    either branch equals the loss's own gradient (and does not fail to trace)."""
    from asrkit.losses import tdt_loss

    rng = np.random.default_rng(3)
    logits = tf.constant(rng.standard_normal((2, 6, 4, 5)), tf.float32)
    durations = tf.constant(rng.standard_normal((2, 6, 4, 3)), tf.float32)
    labels = tf.constant(rng.integers(1, 5, (2, 3)), tf.int32)
    lengths, label_lengths = tf.constant([6, 4]), tf.constant([3, 2])

    def rnnt(x):
        x = x if fused else tf.nn.log_softmax(x)
        return rnnt_loss(x, labels, lengths, label_lengths, fused_log_softmax=fused)

    def gradient(loss):
        with tf.GradientTape() as tape:
            tape.watch(logits)
            value = loss()
        return tape.gradient(value, logits)

    def tdt():
        return tdt_loss(logits, durations, labels, lengths, label_lengths, durations=(0, 1, 2))

    @tf.function(autograph=False)
    def inside(pick_rnnt):
        return gradient(lambda: tf.cond(pick_rnnt, lambda: rnnt(logits), tdt))

    outside = tf.function(lambda: gradient(lambda: rnnt(logits)), autograph=False)()
    np.testing.assert_allclose(inside(tf.constant(True)).numpy(), outside.numpy(), rtol=1e-6,
                               atol=1e-7)  # fmt: skip
    assert np.abs(outside.numpy()).max() > 1e-3
    tdt_inside = inside(tf.constant(False))
    assert np.isfinite(tdt_inside.numpy()).all()
    assert np.abs(tdt_inside.numpy() - outside.numpy()).max() > 1e-3  # the other loss


def test_upstream_gradient_scales_each_utterance():
    rng = np.random.default_rng(2)
    logits, labels, logit_lengths, label_lengths = random_case(rng, 3, 6, 3, 5)
    _, base = loss_and_grad(logits, labels, logit_lengths, label_lengths)
    x = tf.constant(logits)
    weights = tf.constant([2.0, 0.0, -0.5])
    with tf.GradientTape() as tape:
        tape.watch(x)
        total = tf.reduce_sum(rnnt_loss(x, labels, logit_lengths, label_lengths) * weights)
    grad = tape.gradient(total, x).numpy()
    np.testing.assert_allclose(grad, base * weights.numpy()[:, None, None, None], atol=1e-6)


BAD_INPUTS = [
    ("label equals the blank", dict(labels=[[1, 0]]), "blank"),
    ("label >= V", dict(labels=[[1, 5]]), "labels must be < V"),
    ("negative label", dict(labels=[[-1, 2]]), "labels must be >= 0"),
    ("label_lengths > U", dict(label_lengths=[3]), "label_lengths must be <= labels.shape"),
    ("negative label_lengths", dict(label_lengths=[-1]), "label_lengths must be >= 0"),
    ("logit_lengths > T", dict(logit_lengths=[5]), "logit_lengths must be <= logits.shape"),
    ("zero logit_lengths", dict(logit_lengths=[0]), "logit_lengths must be >= 1"),
]


@pytest.mark.parametrize("what,override,message", BAD_INPUTS, ids=[b[0] for b in BAD_INPUTS])
@pytest.mark.parametrize("mode", ["eager", "graph"])
def test_bad_values_raise_clear_errors(what, override, message, mode):
    args = dict(
        logits=np.zeros((1, 4, 3, 5), np.float32),
        labels=[[1, 2]],
        logit_lengths=[4],
        label_lengths=[2],
    )
    args.update(override)
    fn = rnnt_loss if mode == "eager" else tf.function(rnnt_loss, autograph=False)
    with pytest.raises(tf.errors.InvalidArgumentError, match=message):
        fn(**{k: tf.constant(v) for k, v in args.items()})


def test_padding_labels_are_not_validated():
    # Entries past label_lengths are padding: even a blank or out-of-range id there is fine.
    loss = rnnt_loss(np.zeros((1, 4, 3, 5), np.float32), [[1, 9]], [4], [1])
    assert np.isfinite(loss.numpy()).all()


@pytest.mark.parametrize(
    "shapes,message",
    [
        (((1, 4, 3, 5), (1, 3)), "U\\+1"),
        (((1, 4, 5), (1, 2)), "logits must be"),
        (((2, 4, 3, 5), (1, 2)), "batch sizes differ"),
    ],
)
def test_inconsistent_static_shapes_raise(shapes, message):
    logits_shape, labels_shape = shapes
    with pytest.raises(ValueError, match=message):
        rnnt_loss(np.zeros(logits_shape, np.float32), np.ones(labels_shape, np.int32), [4], [1])


def test_blank_outside_vocabulary_raises():
    with pytest.raises(ValueError, match="blank=7"):
        rnnt_loss(np.zeros((1, 4, 3, 5), np.float32), [[1, 2]], [4], [2], blank=7)


def test_keras_wrapper_reductions_and_config():
    rng = np.random.default_rng(4)
    logits, labels, logit_lengths, label_lengths = random_case(rng, 3, 6, 4, 7)
    per_utt = rnnt_loss(logits, labels, logit_lengths, label_lengths).numpy()
    args = (logits, labels, logit_lengths, label_lengths)
    assert np.allclose(RNNTLoss(reduction="none")(*args), per_utt)
    assert np.isclose(RNNTLoss(reduction="sum")(*args), per_utt.sum())
    assert np.isclose(RNNTLoss()(*args), per_utt.mean())
    assert np.isclose(RNNTLoss(reduction="mean_tokens")(*args), per_utt.sum() / label_lengths.sum())
    loss = RNNTLoss(blank=2, reduction="sum")
    restored = RNNTLoss.from_config(loss.get_config())
    assert restored.get_config() == {"blank": 2, "reduction": "sum", "fused_log_softmax": True}
    with pytest.raises(ValueError, match="reduction"):
        RNNTLoss(reduction="mean")
