"""A fixed tiny transducer shared by the decoding tests."""

import numpy as np
import pytest
import tensorflow as tf

from asrkit.models.transducer import Transducer
from tests.tiny import tiny_model_config


# The stateless predictor's variant of every decoding test runs in CI's slow stage.
@pytest.fixture(scope="package", params=["lstm", pytest.param("stateless", marks=pytest.mark.slow)])
def model(request):
    """The decoders carry the predictor's state without looking inside: both kinds."""
    return tiny_transducer(vocab_size=9, seed=4, predictor=request.param)


def tiny_transducer(vocab_size, seed, blank_bias=-2.0, predictor="lstm"):
    tf.keras.utils.set_random_seed(seed)
    m = Transducer(vocab_size, tiny_model_config(predictor=predictor))
    m.build_from_features(80)
    # Move the output bias away from blank so that the untrained model emits symbols.
    bias = m.joint.output_layer.bias
    bias.assign(bias.numpy() + np.r_[blank_bias, np.zeros(vocab_size - 1)])
    return m


def random_features(lengths, seed=0, bins=80):
    rng = np.random.default_rng(seed)
    feats = np.zeros((len(lengths), max(lengths), bins), np.float32)
    for b, n in enumerate(lengths):
        feats[b, :n] = rng.standard_normal((n, bins))
    return feats
