"""One harness for every registered layer: config round trip, eager == graph,
serialization, mixed precision (a test enumerates Keras' registry, so a new layer without a
harness entry fails); plus padding invariance of the encoders and the transducer loss, and
the padding mask and ReLU whose gradients keep less, against their plain definitions."""

import dataclasses
import importlib
import pkgutil

import keras
import numpy as np
import pytest
import tensorflow as tf

import asrkit
from asrkit.config import EncoderConfig, LossConfig, ModelConfig, PredictorConfig
from asrkit.models.attention import SelfAttention
from asrkit.models.conformer import ConformerBlock, ConformerEncoder, FeedForward
from asrkit.models.convolution import ConvolutionModule
from asrkit.models.joint import Joint, SimpleJoiner
from asrkit.models.layers import BatchNorm, relu_keeping_signs, zero_padding
from asrkit.models.linear_adapter import LinearAdapter
from asrkit.models.lstm_encoder import LSTMEncoder
from asrkit.models.predictor import LSTMPredictor, StatelessPredictor, TorchLSTMCell
from asrkit.models.subsampling import ConvSubsampling, StridingSubsampling
from asrkit.models.transducer import Transducer
from asrkit.training.task import LossHeads, TransducerTask
from tests.precision import assert_within_rounding, rounded_products, unit_roundoff

RNG = np.random.default_rng(0)
X = RNG.standard_normal((2, 9, 16)).astype(np.float32)
LENGTHS = np.array([9, 6], np.int32)
FEATS = RNG.standard_normal((2, 40, 20)).astype(np.float32)
FEAT_LENGTHS = np.array([40, 29], np.int32)
LABELS = np.array([[3, 4, 5], [6, 7, 0]], np.int32)

CONFORMER = dict(d_model=16, num_blocks=2, num_heads=2, kernel_size=5, conv_norm="layer",
                 subsampling_filters=8)  # fmt: skip
# NeMo's options (relative attention, its subsampling, xscaling, torch's epsilon, BatchNorm).
NEMO_OPTIONS = dict(attention="relative", conv_norm="frozen_batch", norm_epsilon=1e-5,
                    batch_norm_momentum=0.9, xscaling=True)  # fmt: skip
TINY_MODEL = ModelConfig(
    encoder=EncoderConfig(d_model=16, num_blocks=1, num_heads=2, kernel_size=5,
                          subsampling_filters=8, dropout=0.1),
    predictor=PredictorConfig(embed_dim=8, units=16, dropout=0.1), joint_dim=16,
)  # fmt: skip


def _encoded(m):
    return m(FEATS, FEAT_LENGTHS)[0]


def _tensors():
    return tf.constant(X), tf.constant(X[:, :4])


def _heads(m):
    am, lm = m.simple(X, X[:, :4])
    return tf.concat([am, lm[:, :1]], axis=1)


# Each entry: (the registered class, its factory, call(layer) -> a tensor).
LAYERS = {
    "feed_forward": (FeedForward, lambda: FeedForward(d_model=16, dropout=0.1), lambda m: m(X)),
    "linear_adapter": (LinearAdapter, lambda: LinearAdapter(d_model=16, dim=4), lambda m: m(X)),
    "attention_rotary": (
        SelfAttention,
        lambda: SelfAttention(d_model=16, num_heads=2, dropout=0.0),
        lambda m: m(X, tf.sequence_mask(LENGTHS, 9)),
    ),
    "attention_relative": (
        SelfAttention,
        lambda: SelfAttention(
            d_model=16, num_heads=2, dropout=0.0, positions="relative", use_bias=False
        ),
        lambda m: m(X, tf.sequence_mask(LENGTHS, 9)),
    ),
    "conv_module": (
        ConvolutionModule,
        lambda: ConvolutionModule(
            d_model=16, kernel_size=5, norm="layer", dropout=0.0, context="full"
        ),
        lambda m: m(X, LENGTHS),
    ),
    "conv_module_batch_norm": (
        ConvolutionModule,
        lambda: ConvolutionModule(
            d_model=16,
            kernel_size=5,
            norm="frozen_batch",
            dropout=0.0,
            context="causal",
            use_bias=False,
            epsilon=1e-5,
        ),
        lambda m: m(X, LENGTHS),
    ),
    "batch_norm": (BatchNorm, lambda: BatchNorm(epsilon=1e-5), lambda m: m(X)),
    "conformer_block": (
        ConformerBlock,
        lambda: ConformerBlock(d_model=16, num_heads=2, kernel_size=5, dropout=0.1, out_norm=True),
        lambda m: m(X, LENGTHS),
    ),
    "conformer_block_nemo": (
        ConformerBlock,
        lambda: ConformerBlock(
            d_model=16,
            num_heads=2,
            kernel_size=5,
            dropout=0.1,
            out_norm=True,
            ff_expansion=2,
            use_bias=False,
            **{k: v for k, v in NEMO_OPTIONS.items() if k != "xscaling"},
        ),
        lambda m: m(X, LENGTHS),
    ),
    "subsampling": (
        ConvSubsampling,
        lambda: ConvSubsampling(filters=8, output_dim=16),
        lambda m: m(FEATS, FEAT_LENGTHS)[0],
    ),
    "striding_subsampling": (
        StridingSubsampling,
        lambda: StridingSubsampling(kind="striding", factor=4, filters=8, output_dim=16),
        lambda m: m(FEATS, FEAT_LENGTHS)[0],
    ),
    "dw_striding_subsampling": (
        StridingSubsampling,
        lambda: StridingSubsampling(kind="dw_striding", factor=8, filters=8, output_dim=16),
        lambda m: m(FEATS, FEAT_LENGTHS)[0],
    ),
    "conformer": (
        ConformerEncoder,
        lambda: ConformerEncoder(**CONFORMER, dropout=0.1, final_norm="block"),
        _encoded,
    ),
    "conformer_encoder_norm": (
        ConformerEncoder,
        lambda: ConformerEncoder(**CONFORMER, dropout=0.1, final_norm="encoder"),
        _encoded,
    ),
    "conformer_no_final_norm": (
        ConformerEncoder,
        lambda: ConformerEncoder(**CONFORMER, dropout=0.1, final_norm="none"),
        _encoded,
    ),
    "conformer_nemo_striding": (
        ConformerEncoder,
        lambda: ConformerEncoder(
            **{**CONFORMER, **NEMO_OPTIONS}, dropout=0.1, final_norm="block", subsampling="striding"
        ),
        _encoded,
    ),
    "conformer_nemo_dw_striding": (
        ConformerEncoder,
        lambda: ConformerEncoder(
            **{**CONFORMER, **NEMO_OPTIONS},
            dropout=0.1,
            final_norm="block",
            subsampling="dw_striding",
            subsampling_factor=8,
            use_bias=False,
        ),
        _encoded,
    ),
    "lstm_encoder": (
        LSTMEncoder,
        lambda: LSTMEncoder(units=16, num_layers=2, dropout=0.1, subsampling_filters=8),
        _encoded,
    ),
    "predictor": (
        LSTMPredictor,
        lambda: LSTMPredictor(vocab_size=10, embed_dim=8, units=16, num_layers=1, dropout=0.1),
        lambda m: m(LABELS),
    ),
    "stateless_predictor": (
        StatelessPredictor,
        lambda: StatelessPredictor(
            vocab_size=10, embed_dim=8, units=16, context_size=3, dropout=0.1
        ),
        lambda m: m(LABELS),
    ),
    "joint": (Joint, lambda: Joint(vocab_size=10, dim=12), lambda m: m(X, X[:, :4])),
    "tdt_joint": (
        Joint,
        lambda: Joint(vocab_size=10, dim=12, activation="relu", durations=3),
        lambda m: tf.concat([m(X, X[:, :4]), m.duration_layer(m.hidden(*_tensors()))], -1),
    ),
    "simple_joiner": (
        SimpleJoiner,
        lambda: SimpleJoiner(vocab_size=10),
        lambda m: tf.concat(m(X, X[:, :4]), axis=1),
    ),
    "loss_heads": (
        LossHeads,
        lambda: LossHeads(vocab_size=10, loss=LossConfig(kind="pruned")),
        _heads,
    ),
    "transducer": (
        Transducer,
        lambda: Transducer(10, TINY_MODEL),
        lambda m: m((FEATS, FEAT_LENGTHS, LABELS)),
    ),
    "torch_lstm_cell": (
        TorchLSTMCell,
        lambda: TorchLSTMCell(6),
        lambda m: m(tf.constant(X[:, 0]), [tf.constant(X[:, 1, :6]), tf.constant(X[:, 2, :6])])[0],
    ),
    "hybrid_transducer": (
        Transducer,
        lambda: Transducer(10, dataclasses.replace(TINY_MODEL, ctc_head=True)),
        lambda m: m.ctc_logits(m.encode(FEATS, FEAT_LENGTHS)[0]),
    ),
}
# Registered layers the harness leaves to their own tests, and why.
NOT_IN_HARNESS = {
    TransducerTask: "a training task around a Transducer: tests/training/test_task.py",
}


def _registered_layers() -> set[type]:
    for module in pkgutil.walk_packages(asrkit.__path__, "asrkit."):
        if not module.name.startswith("asrkit.cli"):
            importlib.import_module(module.name)
    objects = keras.saving.get_custom_objects()
    return {
        cls for name, cls in objects.items()
        if name.startswith("asrkit>") and isinstance(cls, type)
        and issubclass(cls, keras.layers.Layer)
    }  # fmt: skip


def test_every_registered_layer_is_in_the_harness():
    covered = {cls for cls, _, _ in LAYERS.values()} | set(NOT_IN_HARNESS)
    missing = sorted(cls.__name__ for cls in _registered_layers() - covered)
    assert not missing, f"registered layers without a harness entry: {missing}"


@pytest.mark.parametrize("name", list(LAYERS))
def test_layer_contract(name):
    cls, factory, run = LAYERS[name]
    layer = factory()
    assert type(layer) is cls
    out = run(layer)
    # Config round trip: same class, same config, and with the same weights the same output.
    clone = type(layer).from_config(layer.get_config())
    assert clone.get_config() == layer.get_config()
    run(clone)
    clone.set_weights(layer.get_weights())
    np.testing.assert_allclose(run(clone), out, atol=1e-6)
    # Keras serialization knows the class by its registered name; the weights load back.
    restored = keras.saving.deserialize_keras_object(keras.saving.serialize_keras_object(layer))
    assert type(restored) is type(layer)
    run(restored)
    restored.set_weights(layer.get_weights())
    np.testing.assert_allclose(run(restored), out, atol=1e-6)
    # Eager == graph.
    np.testing.assert_allclose(tf.function(lambda: run(layer), autograph=False)(), out, atol=1e-5)


@pytest.mark.parametrize("policy", ["mixed_float16", "mixed_bfloat16"])
@pytest.mark.parametrize("name", list(LAYERS))
def test_layer_runs_in_mixed_precision(name, policy):
    """Eagerly and traced (a traced conditional needs one dtype from both branches: the
    depthwise convolutions compute in float32 under every policy), each within the format's
    rounding of the same layer in float32 (tests/precision.py derives the bound)."""
    _, factory, run = LAYERS[name]
    keras.mixed_precision.set_dtype_policy(policy)
    try:
        layer = factory()
        out = run(layer)
        traced = tf.function(lambda: run(layer), autograph=False)()
    finally:
        keras.mixed_precision.set_dtype_policy("float32")
    assert out.dtype == traced.dtype == keras.mixed_precision.Policy(policy).compute_dtype
    reference = factory()
    run(reference)
    reference.set_weights(layer.get_weights())
    want = run(reference).numpy()
    unit, products = unit_roundoff(policy), rounded_products(layer)
    for how, got in (("eager", out), ("traced", traced)):
        error = assert_within_rounding(got, want, unit, products, f"{name} {how}")
        assert error > 0  # the policy's rounding shows: it computed in reduced precision


def test_mixed_bfloat16_depthwise_convolutions_keep_float32_precision():
    """Under mixed bfloat16 the convolution module's depthwise convolution computes in
    float32: its output equals NumPy's float32 convolution of the (bfloat16) gated input."""
    keras.mixed_precision.set_dtype_policy("mixed_bfloat16")
    try:
        module = ConvolutionModule(d_model=16, kernel_size=5, norm="layer", dropout=0.0,
                                   context="full")  # fmt: skip
        module(X, LENGTHS)
        gated = zero_padding(module._gated(tf.constant(X)), LENGTHS)
        got = tf.cast(module.depthwise(gated), tf.float32).numpy()
    finally:
        keras.mixed_precision.set_dtype_policy("float32")
    h = np.pad(gated.numpy().astype(np.float32), [(0, 0), (2, 2), (0, 0)])
    kernel, bias = (w.numpy() for w in module.depthwise.weights)
    want = sum(h[:, k : k + X.shape[1]] * kernel[k, :, 0] for k in range(5)) + bias
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)  # bfloat16 would miss by ~1e-2


ENCODERS = {
    "conformer": lambda: ConformerEncoder(**CONFORMER, dropout=0.0, final_norm="block"),
    "nemo conformer": lambda: ConformerEncoder(
        **{**CONFORMER, **NEMO_OPTIONS}, dropout=0.0, final_norm="block", subsampling="striding"
    ),
    "chunked conformer": lambda: ConformerEncoder(
        **CONFORMER, dropout=0.0, final_norm="block", chunk_frames=2, left_chunks=1
    ),
    "lstm": lambda: LSTMEncoder(units=16, num_layers=2, dropout=0.0, subsampling_filters=8),
}


@pytest.mark.parametrize("kind", list(ENCODERS))
def test_encoder_output_is_the_same_alone_or_batched(kind):
    encoder = ENCODERS[kind]()
    batch = RNG.standard_normal((3, 57, 20)).astype(np.float32)
    lengths = np.array([57, 31, 18], np.int32)
    batch[1, 31:] = RNG.standard_normal((26, 20)) * 100  # garbage in the padding
    batch[2, 18:] = 7.0
    encoded, encoded_lengths = encoder(batch, lengths)
    for b in range(3):
        alone, alone_length = encoder(batch[b : b + 1, : lengths[b]], lengths[b : b + 1])
        n = int(alone_length[0])
        assert n == int(encoded_lengths[b])
        np.testing.assert_allclose(encoded[b, :n], alone[0, :n], atol=1e-5)
        assert np.all(encoded[b, n:].numpy() == 0)


SIZES = {"lstm": dict(lstm_units=16, lstm_layers=1),
         "conformer": dict(d_model=16, num_blocks=1, num_heads=2, kernel_size=5)}  # fmt: skip


def _tiny_transducer(kind="lstm", normalize_by="tokens"):
    config = ModelConfig(
        encoder=EncoderConfig(kind=kind, subsampling_filters=8, dropout=0.0, **SIZES[kind]),
        predictor=PredictorConfig(embed_dim=8, units=16, dropout=0.0),
        joint_dim=16,
    )  # fmt: skip
    return TransducerTask(Transducer(12, config), LossConfig(normalize_by=normalize_by))


@pytest.mark.parametrize("kind", ["lstm", "conformer"])
def test_loss_of_an_utterance_is_the_same_alone_or_batched(kind):
    model = _tiny_transducer(kind, normalize_by="utterances")
    feats = RNG.standard_normal((3, 60, 80)).astype(np.float32)
    lengths = np.array([60, 41, 30], np.int32)
    labels = np.array([[1, 2, 3, 4], [5, 6, 0, 0], [7, 0, 0, 0]], np.int32)
    label_lengths = np.array([4, 2, 1], np.int32)
    batch_sum, count = model.compute_loss_terms((feats, lengths, labels, label_lengths), False)
    assert int(count) == 3
    alone = 0.0
    for b in range(3):
        piece = (feats[b : b + 1, : lengths[b]], lengths[b : b + 1],
                 labels[b : b + 1, : label_lengths[b]], label_lengths[b : b + 1])  # fmt: skip
        loss, _ = model.compute_loss_terms(piece, False)
        alone += float(loss)
    assert float(batch_sum) == pytest.approx(alone, rel=1e-5)
    tokens_model = _tiny_transducer(kind, normalize_by="tokens")
    _, tokens = tokens_model.compute_loss_terms((feats, lengths, labels, label_lengths), False)
    assert int(tokens) == 7


def test_transducer_config_round_trip():
    model = _tiny_transducer("conformer").network
    clone = Transducer.from_config(model.get_config())
    assert clone.config == model.config and clone.vocab_size == 12


@pytest.mark.parametrize("kind", ["lstm", "conformer"])
def test_an_empty_batch_runs_in_graph_mode_with_no_loss_and_no_items(kind):
    """A replica's share of a global micro-batch smaller than the replica count is empty;
    TF's Conv2D alone fails on that (in graph mode), the transducer must not. Its loss and
    count are 0. (Its gradients are whatever the kernels leave for an empty batch, which on
    some machines is unwritten memory: the engine selects them away, see
    tests/training/test_empty_share.py.)"""
    model = _tiny_transducer(kind)
    feats = RNG.standard_normal((2, 40, 80)).astype(np.float32)
    model.compute_loss_terms((feats, np.array([40, 30]), np.ones((2, 3), np.int32),
                              np.array([3, 2])), False)  # fmt: skip

    # Shapes as a distributed step sees them: the batch size is not known when tracing.
    spec = (tf.TensorSpec([None, None, 80]), tf.TensorSpec([None], tf.int32),
            tf.TensorSpec([None, None], tf.int32), tf.TensorSpec([None], tf.int32))  # fmt: skip

    @tf.function(input_signature=[spec], autograph=False)
    def terms_and_grads(batch):
        with tf.GradientTape() as tape:
            loss_sum, count = model.compute_loss_terms(batch, True)
        return loss_sum, count, tape.gradient(loss_sum, model.trainable_variables)

    empty = (np.zeros((0, 40, 80), np.float32), np.zeros((0,), np.int32),
             np.zeros((0, 3), np.int32), np.zeros((0,), np.int32))  # fmt: skip
    loss_sum, count, grads = terms_and_grads(empty)
    assert float(loss_sum) == 0.0 and int(count) == 0
    shapes = [tuple(v.shape) for v in model.trainable_variables]
    assert [None if g is None else tuple(g.shape) for g in grads] == [
        None if g is None else s for g, s in zip(grads, shapes, strict=True)
    ]


def test_torchs_two_lstm_biases_compute_what_one_bias_of_their_sum_does():
    """TorchLSTMCell (torch's b_ih and b_hh) = Keras' LSTMCell with their sum as its bias,
    and a predictor with torch's biases = the same predictor with one."""
    rng = np.random.default_rng(2)
    x, h, c = (tf.constant(rng.standard_normal((3, n)).astype(np.float32)) for n in (5, 6, 6))
    torch_like, keras_cell = TorchLSTMCell(6), keras.layers.LSTMCell(6)
    torch_like(x, [h, c])
    keras_cell(x, [h, c])
    for v in torch_like.weights:
        v.assign(rng.standard_normal(v.shape).astype(np.float32))
    kernel, recurrent, bias, input_bias = (w.numpy() for w in torch_like.weights)
    keras_cell.set_weights([kernel, recurrent, bias + input_bias])
    got, (_, got_c) = torch_like(x, [h, c])
    want, (_, want_c) = keras_cell(x, [h, c])
    np.testing.assert_allclose(got, want, atol=1e-6)
    np.testing.assert_allclose(got_c, want_c, atol=1e-6)


@pytest.mark.parametrize(
    ("blocks", "probability", "mode", "start", "want"),
    [(4, 0.3, "linear", 1, [0.0, 0.1, 0.2, 0.3]), (4, 0.3, "uniform", 1, [0.0, 0.3, 0.3, 0.3]),
     (5, 0.4, "linear", 3, [0.0, 0.0, 0.0, 0.2, 0.4])],
)  # fmt: skip
def test_stochastic_depth_skips_blocks_with_nemos_probabilities(
    blocks, probability, mode, start, want
):
    from asrkit.models.conformer import skip_probabilities

    assert skip_probabilities(blocks, probability, mode, start) == pytest.approx(want)


def test_a_stochastic_depth_step_skips_or_keeps_each_block_whole():
    """Training with stochastic depth: each call's output is the encoder with every droppable
    block either skipped (its input passed on) or kept with its change scaled by 1 / (1 - p);
    both happen over calls; evaluation keeps every block unscaled."""
    encoder = ConformerEncoder(**CONFORMER, dropout=0.0, final_norm="none",
                               stochastic_depth=0.5, stochastic_depth_mode="uniform")  # fmt: skip
    feats, lengths = tf.constant(FEATS), tf.constant(FEAT_LENGTHS)
    evaluated, out_lengths = encoder(feats, lengths, training=False)
    x, sub_lengths = encoder.subsampling(feats, lengths)
    first = encoder.blocks[0](x, sub_lengths)
    second = encoder.blocks[1](first, sub_lengths)
    np.testing.assert_allclose(evaluated, zero_padding(second, out_lengths), atol=1e-5)
    skipped = zero_padding(first, out_lengths)
    kept = zero_padding(first + (second - first) / 0.5, out_lengths)
    seen = set()
    for _ in range(12):
        trained, _ = encoder(feats, lengths, training=True)
        if np.allclose(trained, skipped, atol=1e-5):
            seen.add("skipped")
        else:
            np.testing.assert_allclose(trained, kept, atol=1e-4)
            seen.add("kept")
    assert seen == {"skipped", "kept"}


def test_zero_padding_selects_frames_and_its_gradient_passes_only_real_ones():
    x = tf.constant(np.where(np.arange(9)[None, :, None] < 7, X, np.nan).astype(np.float32))
    lengths = tf.constant([7, 4])
    with tf.GradientTape() as tape:
        tape.watch(x)
        out = zero_padding(x, lengths)
        upstream = tf.constant(RNG.standard_normal(X.shape).astype(np.float32))
        total = tf.reduce_sum(out * upstream)
    real = (np.arange(9)[None, :] < np.array([7, 4])[:, None])[..., None]
    np.testing.assert_array_equal(out.numpy(), np.where(real, x.numpy(), 0.0))  # NaN padding: 0
    np.testing.assert_array_equal(tape.gradient(total, x).numpy(), np.where(real, upstream, 0.0))


def test_relu_keeping_signs_is_relu_forward_and_backward():
    x = tf.constant(np.concatenate([X.ravel(), [0.0, -0.0]]).astype(np.float32))
    upstream = tf.constant(RNG.standard_normal(x.shape).astype(np.float32))
    grads = []
    for fn in (relu_keeping_signs, tf.nn.relu):
        with tf.GradientTape() as tape:
            tape.watch(x)
            out = fn(x)
            total = tf.reduce_sum(out * upstream)
        grads.append(tape.gradient(total, x).numpy())
        np.testing.assert_array_equal(out.numpy(), np.maximum(x.numpy(), 0.0))
    np.testing.assert_array_equal(grads[0], grads[1])
    np.testing.assert_array_equal(grads[0], np.where(x.numpy() > 0, upstream.numpy(), 0.0))
