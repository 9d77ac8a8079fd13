"""LoRA on a transducer: an adapted network starts as its base, trains only its factors,
and its merged plain weights compute what the adapted network computes (a NumPy merge as
the expectation)."""

import dataclasses

import keras
import numpy as np
import pytest

from asrkit.checkpoints import named_variables
from asrkit.config import LORA_TARGETS, AdaptersConfig, ConfigError, load_config
from asrkit.models.adapters import LORA_A, LORA_B, add_adapters, lora_layers, merged_weights
from asrkit.models.transducer import Transducer
from asrkit.training.task import TransducerTask
from tests.tiny import tiny_encoder, tiny_model_config

EVERY = AdaptersConfig(kind="lora", rank=3, alpha=6.0, targets=LORA_TARGETS)


def _network(seed=0, blocks=2):
    config = dataclasses.replace(tiny_model_config(),
                                 encoder=tiny_encoder("conformer", num_blocks=blocks))  # fmt: skip
    keras.utils.set_random_seed(seed)
    network = Transducer(9, config)
    network.build_from_features(80)
    return network


def _outputs(network, seed=1):
    rng = np.random.default_rng(seed)
    features = rng.standard_normal((2, 48, 80)).astype(np.float32)
    encoded, _ = network.encode(features, np.array([48, 31]))
    predicted = network.predict_labels(np.array([[1, 2, 3], [4, 0, 0]], np.int32))
    return np.asarray(network.join(encoded, predicted))


def _copy(source, target):
    values = {k: v.numpy() for k, v in named_variables(source).items()}
    for name, var in named_variables(target).items():
        var.assign(values[name])


def test_an_adapted_network_starts_as_its_base_and_trains_only_its_factors():
    base, adapted = _network(), _network(seed=5)
    _copy(base, adapted)
    names = add_adapters(adapted, EVERY)
    # 2 blocks x (qkv, out; 2 feed-forwards x 2; 2 pointwise) + the joint's 3
    assert len(names) == 2 * (2 + 4 + 2) + 3
    np.testing.assert_array_equal(_outputs(adapted), _outputs(base))  # B starts at zero
    trained = {k for k, v in named_variables(adapted).items() if v.trainable}
    assert trained == {f"{n}.{f}" for n in names for f in (LORA_A, LORA_B)}
    for name in names:
        a = named_variables(adapted)[f"{name}.{LORA_A}"]
        assert a.shape[1] == 3 and a.dtype == "float32"
    # AdamW keeps slots for the factors only
    task = TransducerTask(adapted)
    task.compile(keras.optimizers.AdamW(1e-3))
    task.optimizer.build(task.trainable_variables)
    factors = sum(int(np.prod(v.shape)) for v in task.trainable_variables)
    slots = sum(int(np.prod(v.shape)) for v in task.optimizer.variables if len(v.shape))
    assert slots == 2 * factors
    assert factors < sum(int(np.prod(v.shape)) for v in adapted.variables) / 4


@pytest.mark.parametrize("targets", [("attention",), ("feed_forward", "joint"), LORA_TARGETS])
def test_merged_weights_compute_what_the_adapted_network_computes(targets):
    config = AdaptersConfig(kind="lora", rank=2, alpha=5.0, targets=targets)
    adapted = _network()
    add_adapters(adapted, config)
    rng = np.random.default_rng(7)
    for name, var in named_variables(adapted).items():
        if name.endswith(LORA_B):  # a trained update
            var.assign(0.1 * rng.standard_normal(var.shape).astype(np.float32))
    values = {k: v.numpy() for k, v in named_variables(adapted).items()}
    merged = merged_weights(values, config)
    for name in lora_layers(adapted, targets):  # the NumPy expectation
        expected = (
            values[f"{name}.kernel"] + 2.5 * values[f"{name}.{LORA_A}"] @ values[f"{name}.{LORA_B}"]
        )
        np.testing.assert_allclose(merged[f"{name}.kernel"], expected, rtol=1e-6, atol=1e-7)
    plain = _network(seed=9)
    assert set(named_variables(plain)) == set(merged)
    for name, var in named_variables(plain).items():
        var.assign(merged[name])
    out = _outputs(adapted)
    assert np.abs(out - _outputs(_network(seed=9))).max() > 1e-3  # the update matters
    np.testing.assert_allclose(_outputs(plain), out, rtol=1e-5, atol=1e-5)


def test_weights_without_factors_pass_through_and_factors_need_the_config():
    plain = {k: v.numpy() for k, v in named_variables(_network()).items()}
    assert merged_weights(plain, AdaptersConfig()).keys() == plain.keys()
    adapted = _network()
    add_adapters(adapted, EVERY)
    values = {k: v.numpy() for k, v in named_variables(adapted).items()}
    with pytest.raises(ValueError, match=r"model\.adapters\.kind is 'none'"):
        merged_weights(values, AdaptersConfig())


def test_lora_settings_are_checked_like_every_other_key():
    assert load_config(None, ["model.adapters.kind=lora"]).model.adapters.rank == 8
    for sets, match in [
        (["model.adapters.rank=4"], "applies to model.adapters.kind lora only"),
        (["model.adapters.kind=lora", "model.adapters.targets=[attention, qkv]"],
         "distinct names from"),
        (["model.adapters.kind=lora", "model.adapters.rank=0"], "rank must be >= 1"),
        (["model.adapters.kind=lora", "model.adapters.alpha=0"], "alpha must be > 0"),
        (["model.adapters.kind=adapter"], "kind must be one of"),
    ]:  # fmt: skip
        with pytest.raises(ConfigError, match=match):
            load_config(None, sets)


def test_an_lstm_encoder_takes_lora_in_its_joint_only():
    config = tiny_model_config()
    keras.utils.set_random_seed(0)
    network = Transducer(9, config)
    network.build_from_features(80)
    with pytest.raises(ValueError, match="no Conformer blocks"):
        add_adapters(network, AdaptersConfig(kind="lora"))
    assert add_adapters(network, AdaptersConfig(kind="lora", targets=("joint",))) == [
        "joint.encoder_proj",
        "joint.output_layer",
        "joint.predictor_proj",
    ]


def _linear_network(seed=0, dim=4):
    config = dataclasses.replace(
        tiny_model_config(), encoder=tiny_encoder("nemo_conformer", num_blocks=2),
        adapters=AdaptersConfig(kind="linear", dim=dim),
    )  # fmt: skip
    keras.utils.set_random_seed(seed)
    network = Transducer(9, config)
    network.build_from_features(80)
    return network


def test_linear_adapters_start_as_the_base_and_only_they_train():
    """NeMo's linear adapter on each block: the base's weights copied by name, the output is
    the base's (the adapters' last layer starts at zero); only the adapters train."""
    base = Transducer(9, dataclasses.replace(
        tiny_model_config(), encoder=tiny_encoder("nemo_conformer", num_blocks=2)))  # fmt: skip
    base.build_from_features(80)
    adapted = _linear_network(seed=3)
    values = {k: v.numpy() for k, v in named_variables(base).items()}
    fresh = [n for n in named_variables(adapted) if n not in values]
    assert sorted(fresh) == sorted(
        f"encoder.blocks.{i}.adapter.{w}" for i in range(2)
        for w in ("norm.gamma", "norm.beta", "down.kernel", "up.kernel"))  # fmt: skip
    for name, var in named_variables(adapted).items():
        if name in values:
            var.assign(values[name])
    np.testing.assert_array_equal(_outputs(adapted), _outputs(base))
    names = add_adapters(adapted, AdaptersConfig(kind="linear", dim=4))
    assert names == ["encoder.blocks.0.adapter", "encoder.blocks.1.adapter"]
    trained = {k for k, v in named_variables(adapted).items() if v.trainable}
    assert trained == set(fresh)


def test_a_linear_adapter_is_numpys_residual_bottleneck():
    """x + up(swish(down(LayerNorm(x)))), no biases, the norm's epsilon the block's."""
    from asrkit.models.linear_adapter import LinearAdapter

    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 7, 16)).astype(np.float32)
    adapter = LinearAdapter(d_model=16, dim=5, epsilon=1e-5)
    adapter(x)
    gamma, beta = rng.standard_normal(16), rng.standard_normal(16)
    down, up = rng.standard_normal((16, 5)), rng.standard_normal((5, 16))
    for var, value in ((adapter.norm.gamma, gamma), (adapter.norm.beta, beta),
                       (adapter.down.kernel, down), (adapter.up.kernel, up)):  # fmt: skip
        var.assign(value.astype(np.float32))
    x64 = x.astype(np.float64)
    normed = (x64 - x64.mean(-1, keepdims=True)) / np.sqrt(x64.var(-1, keepdims=True) + 1e-5)
    h = (normed * gamma + beta) @ down
    expected = x64 + (h / (1 + np.exp(-h))) @ up
    np.testing.assert_allclose(np.asarray(adapter(x)), expected, rtol=1e-4, atol=1e-4)
    assert len(adapter.weights) == 4  # gamma, beta, two kernels


def test_linear_adapter_settings_are_checked():
    assert load_config(None, ["model.adapters.kind=linear"]).model.adapters.dim == 32
    with pytest.raises(ConfigError, match=r"applies to model\.adapters\.kind linear only"):
        load_config(None, ["model.adapters.kind=lora", "model.adapters.dim=8"])
    with pytest.raises(ConfigError, match=r"applies to model\.adapters\.kind lora only"):
        load_config(None, ["model.adapters.kind=linear", "model.adapters.rank=4"])
    with pytest.raises(ValueError, match="an lstm encoder has none"):
        Transducer(9, dataclasses.replace(tiny_model_config(),
                                          adapters=AdaptersConfig(kind="linear")))  # fmt: skip
