"""asrkit's Conformer with NeMo's options against NeMo's own ConformerEncoder: tiny
random-init models (striding x4 Conformer, dw_striding x8 FastConformer; BatchNorm running
statistics randomised) whose checkpoints and outputs on NeMo's features of real speech NeMo
wrote (tools/make_nemo_fixtures.py)."""

import json
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf

from asrkit.config import EncoderConfig
from asrkit.importers.nemo_weights import WeightMismatch, assign_nemo_encoder
from asrkit.importers.torch_checkpoint import read_torch_checkpoint
from asrkit.models.conformer import ConformerEncoder
from asrkit.models.transducer import build_encoder

NEMO = Path(__file__).resolve().parents[1] / "data" / "nemo"


def _encoder(config: dict) -> ConformerEncoder:
    """NeMo's encoder config -> asrkit's Conformer with NeMo's options, by hand (the
    importer's own mapping is tested on whole models in tests/importers)."""
    return build_encoder(EncoderConfig(
        kind="conformer", d_model=config["d_model"], num_blocks=config["n_layers"],
        num_heads=config["n_heads"], ff_expansion=config["ff_expansion_factor"],
        kernel_size=config["conv_kernel_size"], attention="relative",
        subsampling=config["subsampling"], subsampling_factor=config["subsampling_factor"],
        subsampling_filters=config["subsampling_conv_channels"], xscaling=config["xscaling"],
        norm_epsilon=1e-5, conv_norm="frozen_batch", final_norm="block", dropout=0.0,
    ))  # fmt: skip


@pytest.fixture(scope="module")
def features():
    data = np.load(NEMO / "features.npz")
    return data["conformer/features"].transpose(0, 2, 1), data["conformer/lengths"]


@pytest.mark.parametrize("name", ["conformer_x4", "fastconformer_x8"])
def test_the_encoder_equals_nemos_on_real_speech(features, name):
    config = json.loads((NEMO / "encoders.json").read_text())[name]
    reference = np.load(NEMO / "encoders.npz")
    feats, lengths = features
    encoder = _encoder(config)
    encoder(tf.constant(feats[:1, :64]), tf.constant([64]))  # builds every variable
    state = read_torch_checkpoint(NEMO / f"{name}.ckpt")
    used = assign_nemo_encoder(encoder, state)
    assert used == set(state)
    encoded, encoded_lengths = encoder(tf.constant(feats), tf.constant(lengths))
    want_lengths = reference[f"{name}/lengths"]
    np.testing.assert_array_equal(encoded_lengths.numpy(), want_lengths)
    want = reference[f"{name}/encoded"].transpose(0, 2, 1)  # NeMo's [B, D, T'] -> [B, T', D]
    assert encoded.shape == want.shape
    for b, n in enumerate(want_lengths):
        np.testing.assert_allclose(encoded.numpy()[b, :n], want[b, :n], atol=1e-4, rtol=0)
    assert np.abs(want).max() > 0.5  # a real output, not near zero


def test_a_checkpoint_that_does_not_fit_is_named(features):
    config = json.loads((NEMO / "encoders.json").read_text())["conformer_x4"]
    encoder = _encoder({**config, "conv_kernel_size": 7})
    feats, _ = features
    encoder(tf.constant(feats[:1, :64]), tf.constant([64]))
    state = read_torch_checkpoint(NEMO / "conformer_x4.ckpt")
    with pytest.raises(WeightMismatch, match=r"layers\.0\.conv\.depthwise_conv\.weight: shape"):
        assign_nemo_encoder(encoder, state)
    with pytest.raises(WeightMismatch, match="no place in the model"):
        assign_nemo_encoder(_built(config, feats), {**state, "layers.9.extra": np.zeros(1)})


def _built(config, feats):
    encoder = _encoder(config)
    encoder(tf.constant(feats[:1, :64]), tf.constant([64]))
    return encoder
