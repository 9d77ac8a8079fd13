"""`train.trainable` beside `model.adapters`: the names it gives (checkpoint names or their
prefixes) are the weights that train in full beside the LoRA factors; a name matching
nothing, or the setting without adapters, is refused by name."""

import pytest

from asrkit.checkpoints import named_variables
from asrkit.config import ConfigError, load_config
from asrkit.models.transducer import Transducer
from asrkit.training.adapting import apply_adapters, named_weights

TINY = ["model.encoder.kind=conformer", "model.encoder.d_model=16", "model.encoder.num_blocks=1",
        "model.encoder.num_heads=2", "model.encoder.kernel_size=5",
        "model.encoder.subsampling_filters=8", "model.predictor.units=16",
        "model.predictor.embed_dim=8", "model.joint_dim=16",
        "model.adapters.kind=lora"]  # fmt: skip


def _network(config):
    return Transducer(11, config.model)


def test_named_weights_train_in_full_beside_the_factors():
    config = load_config(None, [*TINY, "train.trainable=[joint.output_layer, predictor.embedding]"])
    network = _network(config)
    adapted = apply_adapters(network, config)
    trained = {k for k, v in named_variables(network).items() if v.trainable}
    factors = {f"{n}.lora_kernel_{x}" for n in adapted for x in "ab"}
    assert trained == factors | {"joint.output_layer.kernel", "joint.output_layer.bias",
                                 "predictor.embedding.embeddings"}  # fmt: skip


def test_a_name_matching_no_weight_is_refused_with_the_networks_parts():
    config = load_config(None, TINY)
    network = _network(config)
    network.build_from_features(80)
    with pytest.raises(ConfigError, match=r"'joint\.output' names no weight.*joint\.output_layer"):
        named_weights(network, ("joint.output",))  # a prefix stops at a dot
    assert len(named_weights(network, ("joint.output_layer.",))) == 2


def test_trainable_without_adapters_is_refused():
    with pytest.raises(ConfigError, match=r"names what trains beside model\.adapters"):
        load_config(None, [*TINY[:-1], "train.trainable=[joint]"])
