"""A .nemo holding NeMo's linear adapters (`tools/make_nemo_fixtures.py --parts adapters`:
the committed rnnt.nemo with a randomised LinearAdapter `ft` enabled on its encoder and a
second one `off` disabled) imports as `model.adapters.kind: linear`: its encoder frames
and greedy tokens are NeMo's with the adapter enabled; the disabled one is left out with a
note; fine-tuning it trains the adapters alone."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from asrkit.decoding.search.front import DecodeOptions, decode_batch
from asrkit.experiment import load_experiment
from asrkit.importers.nemo_model import UnsupportedNemoModel, import_nemo, plan_import
from tests.importers.clips import clip_features

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "tests/data/nemo"
META = json.loads((DATA / "adapters.json").read_text())
ARRAYS = np.load(DATA / "adapters.npz")


@pytest.fixture(scope="module")
def imported(tmp_path_factory):
    exp = tmp_path_factory.mktemp("adapters") / "exp"
    summary = import_nemo(DATA / "adapters.nemo", exp)
    experiment = load_experiment(exp)
    batch, lengths = clip_features(META["clips"], experiment.config.features)
    return summary, experiment, batch, lengths


def test_the_imported_adapters_compute_what_nemo_computes(imported):
    summary, experiment, batch, lengths = imported
    adapters = experiment.config.model.adapters
    assert (adapters.kind, adapters.dim) == ("linear", 8)
    assert any("adapters.off is disabled" in note for note in summary.plan.notes)
    encoded, encoded_lengths = experiment.network.encode(batch, lengths)
    want = ARRAYS["encoded"].transpose(0, 2, 1)
    np.testing.assert_array_equal(encoded_lengths.numpy(), ARRAYS["encoded_lengths"])
    for row, n in enumerate(ARRAYS["encoded_lengths"]):
        np.testing.assert_allclose(encoded.numpy()[row, :n], want[row, :n], atol=1e-4)
    options = DecodeOptions(max_symbols_per_step=experiment.config.decode.max_symbols_per_step)
    hyps = decode_batch(experiment.network, batch, lengths, experiment.tokenizer, options)
    assert [[t - 1 for t in h.tokens] for h in hyps] == META["greedy"]


def test_adapters_asrkit_does_not_model_are_refused_by_key():
    base = {"global_cfg": {"adapter_meta_cfg": {"modules": {"a": "encoder"}}},
            "a": {"_target_": "nemo.collections.common.parts.adapter_modules.LinearAdapter",
                  "in_features": 32, "dim": 8, "activation": "swish", "norm_position": "pre",
                  "enabled": True}}  # fmt: skip
    config = yaml_config()
    for change, match in [
        ({"norm_position": "post"}, "adapters.a.norm_position: 'post'"),
        ({"activation": "relu"}, "adapters.a.activation: 'relu'"),
        ({"_target_": "x.MultiHeadAttentionAdapter"}, "adapters.a._target_"),
    ]:
        adapters = {**base, "a": {**base["a"], **change}}
        with pytest.raises(UnsupportedNemoModel, match=match):
            plan_import({**config, "adapters": adapters}, "m.nemo")
    two = {**base, "b": dict(base["a"])}
    with pytest.raises(UnsupportedNemoModel, match=r"adapters \['a', 'b'\] are enabled together"):
        plan_import({**config, "adapters": two}, "m.nemo")


def yaml_config() -> dict:
    """The fixture archive's own model config."""
    from asrkit.importers.nemo_archive import read_nemo

    return read_nemo(DATA / "rnnt.nemo").config
