"""Experiment directories across asrkit versions: a config or checkpoint of another schema
is refused by name, before anything is read with other meanings or written."""

import json

from asrkit.checkpoints import CheckpointManager, TrainState
from asrkit.cli.main import main
from asrkit.config import SCHEMA_VERSION, EncoderConfig, ExperimentConfig, ModelConfig, dump_config
from asrkit.models.transducer import Transducer

ENCODER = dict(kind="conformer", d_model=16, num_blocks=1, num_heads=2, kernel_size=5,
               subsampling_filters=8, dropout=0.0)  # fmt: skip


def _experiment(tmp_path):
    exp = tmp_path / "exp"
    model = ModelConfig(encoder=EncoderConfig(**ENCODER), joint_dim=16)
    exp.mkdir()
    (exp / "config.yaml").write_text(dump_config(ExperimentConfig(model=model)))
    network = Transducer(9, model)
    network.build_from_features(80)
    CheckpointManager(exp / "checkpoints", keep=1).save(network, TrainState(1, 0, 5))
    return exp


def _one_error(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    return err[0]


def test_the_recorded_config_states_its_schema_and_another_is_refused(tmp_path, capsys):
    exp = _experiment(tmp_path)
    recorded = (exp / "config.yaml").read_text()
    assert f"schema: {SCHEMA_VERSION}\n" in recorded
    (exp / "config.yaml").write_text(recorded.replace(f"schema: {SCHEMA_VERSION}\n", ""))
    before = (exp / "config.yaml").read_text()
    assert main(["train", "--exp-dir", str(exp)]) == 2
    line = _one_error(capsys)
    assert f"{exp}/config.yaml: recorded by an older asrkit (no schema version)" in line
    assert main(["decode", "--exp-dir", str(exp), "--manifest", "m.jsonl"]) == 2
    assert "no schema version" in _one_error(capsys)
    (exp / "config.yaml").write_text(before.replace("model:", "schema: 99\nmodel:", 1))
    assert main(["decode", "--exp-dir", str(exp), "--manifest", "m.jsonl"]) == 2
    assert f"schema 99: this asrkit reads config schema {SCHEMA_VERSION}" in _one_error(capsys)
    assert (exp / "config.yaml").read_text().startswith("schema: 99")  # nothing rewritten


def test_a_checkpoint_of_another_schema_is_refused(tmp_path):
    import pytest

    from asrkit.checkpoints import CheckpointError, _record_files, restore

    exp = _experiment(tmp_path)
    (checkpoint,) = CheckpointManager(exp / "checkpoints").checkpoints()
    state = json.loads((checkpoint / "state.json").read_text())
    assert state["schema"] == SCHEMA_VERSION
    del state["schema"]
    (checkpoint / "state.json").write_text(json.dumps(state))
    _record_files(checkpoint)  # intact, only of another version
    network = Transducer(9, ModelConfig(encoder=EncoderConfig(**ENCODER), joint_dim=16))
    network.build_from_features(80)
    with pytest.raises(CheckpointError, match="written by another asrkit"):
        restore(network, checkpoint)
