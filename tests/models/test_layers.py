"""One harness for every layer: config round trip, eager == graph, serialization, mixed
precision; plus padding invariance of the encoders and the transducer loss."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from asrkit.config import EncoderConfig, LossConfig, ModelConfig, PredictorConfig
from asrkit.models.conformer import (
    ConformerBlock,
    ConformerEncoder,
    ConvolutionModule,
    FeedForward,
    RotarySelfAttention,
)
from asrkit.models.joint import Joint
from asrkit.models.lstm_encoder import LSTMEncoder
from asrkit.models.predictor import LSTMPredictor, StatelessPredictor
from asrkit.models.subsampling import ConvSubsampling
from asrkit.models.transducer import Transducer
from asrkit.training.task import TransducerTask

RNG = np.random.default_rng(0)
X = RNG.standard_normal((2, 9, 16)).astype(np.float32)
LENGTHS = np.array([9, 6], np.int32)
FEATS = RNG.standard_normal((2, 40, 20)).astype(np.float32)
FEAT_LENGTHS = np.array([40, 29], np.int32)
LABELS = np.array([[3, 4, 5], [6, 7, 0]], np.int32)

CONFORMER = dict(d_model=16, num_blocks=2, num_heads=2, kernel_size=5, conv_norm="layer",
                 subsampling_filters=8)  # fmt: skip

# (factory, call) pairs: call(layer) -> a tensor
LAYERS = {
    "feed_forward": (lambda: FeedForward(d_model=16, dropout=0.1), lambda m: m(X)),
    "attention": (
        lambda: RotarySelfAttention(d_model=16, num_heads=2, dropout=0.0),
        lambda m: m(X, tf.sequence_mask(LENGTHS, 9)),
    ),
    "conv_module": (
        lambda: ConvolutionModule(
            d_model=16, kernel_size=5, norm="layer", dropout=0.0, context="full"
        ),
        lambda m: m(X, LENGTHS),
    ),
    "conformer_block": (
        lambda: ConformerBlock(
            d_model=16,
            num_heads=2,
            kernel_size=5,
            dropout=0.1,
            conv_norm="layer",
            conv_context="full",
            out_norm=True,
        ),
        lambda m: m(X, LENGTHS),
    ),
    "subsampling": (
        lambda: ConvSubsampling(filters=8, output_dim=16),
        lambda m: m(FEATS, FEAT_LENGTHS)[0],
    ),
    "conformer": (
        lambda: ConformerEncoder(**CONFORMER, dropout=0.1, final_norm="block"),
        lambda m: m(FEATS, FEAT_LENGTHS)[0],
    ),
    "conformer_encoder_norm": (
        lambda: ConformerEncoder(**CONFORMER, dropout=0.1, final_norm="encoder"),
        lambda m: m(FEATS, FEAT_LENGTHS)[0],
    ),
    "conformer_no_final_norm": (
        lambda: ConformerEncoder(**CONFORMER, dropout=0.1, final_norm="none"),
        lambda m: m(FEATS, FEAT_LENGTHS)[0],
    ),
    "lstm_encoder": (
        lambda: LSTMEncoder(units=16, num_layers=2, dropout=0.1, subsampling_filters=8),
        lambda m: m(FEATS, FEAT_LENGTHS)[0],
    ),
    "predictor": (
        lambda: LSTMPredictor(vocab_size=10, embed_dim=8, units=16, num_layers=1, dropout=0.1),
        lambda m: m(LABELS),
    ),
    "stateless_predictor": (
        lambda: StatelessPredictor(
            vocab_size=10, embed_dim=8, units=16, context_size=3, dropout=0.1
        ),
        lambda m: m(LABELS),
    ),
    "joint": (lambda: Joint(vocab_size=10, dim=12), lambda m: m(X, X[:, :4])),
}


@pytest.mark.parametrize("name", list(LAYERS))
def test_layer_contract(name):
    factory, run = LAYERS[name]
    layer = factory()
    out = run(layer)
    # Config round trip: same class, same config, and with the same weights the same output.
    clone = type(layer).from_config(layer.get_config())
    assert clone.get_config() == layer.get_config()
    run(clone)
    clone.set_weights(layer.get_weights())
    np.testing.assert_allclose(run(clone), out, atol=1e-6)
    # Keras serialization knows the class by its registered name.
    restored = keras.saving.deserialize_keras_object(keras.saving.serialize_keras_object(layer))
    assert type(restored) is type(layer)
    # Eager == graph.
    np.testing.assert_allclose(tf.function(lambda: run(layer), autograph=False)(), out, atol=1e-5)


@pytest.mark.parametrize("name", ["conformer_block", "conformer", "lstm_encoder", "joint"])
def test_layer_runs_in_mixed_float16(name):
    factory, run = LAYERS[name]
    keras.mixed_precision.set_dtype_policy("mixed_float16")
    try:
        layer = factory()
        out = run(layer)
    finally:
        keras.mixed_precision.set_dtype_policy("float32")
    assert out.dtype == tf.float16
    assert np.isfinite(out.numpy().astype(np.float32)).all()


ENCODERS = {
    "conformer": lambda: ConformerEncoder(**CONFORMER, dropout=0.0, final_norm="block"),
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


def _tiny_transducer(kind="lstm", normalize_by="tokens"):
    config = ModelConfig(
        encoder=EncoderConfig(kind=kind, d_model=16, num_blocks=1, num_heads=2, kernel_size=5,
                              subsampling_filters=8, lstm_units=16, lstm_layers=1, dropout=0.0),
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
