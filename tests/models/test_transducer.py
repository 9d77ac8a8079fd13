"""The transducer network: an encoder in another precision for inference."""

import numpy as np
import pytest
import tensorflow as tf

from asrkit.checkpoints import assign_weights, named_variables
from asrkit.config import EncoderConfig, ModelConfig
from asrkit.models.transducer import Transducer


def _network(precision=None, **encoder) -> Transducer:
    config = ModelConfig(encoder=EncoderConfig(
        kind="conformer", d_model=32, num_blocks=2, num_heads=4, kernel_size=5,
        subsampling="dw_striding", subsampling_factor=8, subsampling_filters=16,
        attention="relative", conv_norm="frozen_batch", final_norm="block", dropout=0.0,
        **encoder,
    ))  # fmt: skip
    network = Transducer(17, config, encoder_precision=precision)
    network.build_from_features(20)
    return network


def test_a_bfloat16_encoder_holds_the_float32_weights_rounded_once():
    """The same named weights assigned to a network whose encoder is bfloat16: every
    encoder weight is the float32 one rounded to bfloat16 but the depthwise convolution's
    (kept float32); the frames leave float32 and near the float32 network's; the predictor
    and joint hold the float32 values."""
    float32 = _network()
    rng = np.random.default_rng(0)
    for weight in float32.weights:  # away from the initialisers' round values
        if weight.dtype == "float32":
            value = rng.normal(0, 0.3, weight.shape).astype(np.float32)
            weight.assign(np.abs(value) + 0.5 if "variance" in weight.path else value)
    values = {name: v.numpy() for name, v in named_variables(float32).items()}
    bfloat16 = _network("bfloat16")
    assign_weights(bfloat16, values)
    assert bfloat16.encoder.compute_dtype == "bfloat16"
    encoder = bfloat16.encoder  # its depthwise convolutions: the blocks' and subsampling's
    depthwise = [b.conv.depthwise for b in encoder.blocks] + encoder.subsampling.convs[1:]
    depthwise = {id(v) for layer in depthwise for v in layer.weights}
    kept = []
    for name, weight in named_variables(bfloat16).items():
        if weight.dtype not in ("float32", "bfloat16"):  # a seed generator's state
            np.testing.assert_array_equal(weight.numpy(), values[name])
            continue
        got = tf.cast(weight.value, tf.float32).numpy()
        if name.startswith("encoder") and weight.dtype == "bfloat16":
            rounded = tf.cast(tf.cast(values[name], tf.bfloat16), tf.float32).numpy()
            np.testing.assert_array_equal(got, rounded)
            assert not np.array_equal(got, values[name])
        else:
            np.testing.assert_array_equal(got, values[name])
            kept.append(weight)
    assert {id(v) for v in kept if v.path.startswith("encoder")} == depthwise
    assert any(v.path.startswith("joint") for v in kept)
    features = tf.constant(rng.normal(size=(2, 96, 20)).astype(np.float32))
    lengths = tf.constant([96, 61])
    want, want_lengths = float32.encode(features, lengths)
    got, got_lengths = bfloat16.encode(features, lengths)
    assert got.dtype == tf.float32
    np.testing.assert_array_equal(got_lengths.numpy(), want_lengths.numpy())
    for row, n in enumerate(want_lengths.numpy()):
        ref = want.numpy()[row, :n]
        relative = np.sqrt(np.mean((got.numpy()[row, :n] - ref) ** 2) / np.mean(ref**2))
        assert 1e-4 < relative < 2e-2, relative


def test_an_unknown_encoder_precision_and_a_bfloat16_lstm_are_refused():
    with pytest.raises(ValueError, match="encoder precision must be one of"):
        _network("float16")
    lstm = ModelConfig(encoder=EncoderConfig(kind="lstm", lstm_units=16, lstm_layers=1))
    with pytest.raises(ValueError, match="a bfloat16 encoder is a Conformer"):
        Transducer(17, lstm, encoder_precision="bfloat16")
