"""Strict configuration: unknown keys and wrong types are errors that name key and section."""

import dataclasses
from pathlib import Path

import pytest
import yaml

from asrkit.config import ConfigError, ExperimentConfig, dump_config, load_config


def write(tmp_path, text):
    path = tmp_path / "conf.yaml"
    path.write_text(text)
    return path


def test_defaults_and_overrides(tmp_path):
    path = write(tmp_path, "train:\n  epochs: 3\nmodel:\n  encoder:\n    kind: lstm\n")
    config = load_config(path, ["train.learning_rate=0.002", "model.encoder.lstm_units=64"])
    assert config.train.epochs == 3 and config.train.learning_rate == 0.002
    assert config.model.encoder.kind == "lstm" and config.model.encoder.lstm_units == 64
    assert config.model.encoder.num_heads == ExperimentConfig().model.encoder.num_heads
    assert isinstance(config.train.learning_rate, float)


@pytest.mark.parametrize(
    "text,message",
    [
        ("train:\n  epoch: 3\n", "unknown key 'epoch' in section 'train'"),
        ("model:\n  encoder:\n    depth: 3\n", "unknown key 'depth' in section 'model.encoder'"),
        ("trian: {}\n", "unknown key 'trian' in the top level"),
        ("train:\n  epochs: three\n", "'train.epochs' must be int"),
        ("train:\n  epochs: 2.5\n", "'train.epochs' must be int"),
        ("train:\n  precision: fp16\n", "train.precision must be one of"),
        ("data: 3\n", "section 'data' must be a mapping"),
        ("loss:\n  delay_penalty: -0.1\n", "loss.delay_penalty must be >= 0"),
        ("loss:\n  kind: pruned\n  delay_penalty: 0.01\n", "with loss.kind=full only"),
        ("loss:\n  ctc_weight: -0.2\n", "loss.ctc_weight must be >= 0"),
        ("loss:\n  ctc_normalize_by: utterances\n", "needs loss.ctc_weight > 0"),
        ("loss:\n  ctc_weight: 0.3\n  ctc_normalize_by: frames\n", "ctc_normalize_by must be one"),
        ("model:\n  encoder: {chunk_frames: -4}\n", "chunk_frames must be >= 0"),
        ("model:\n  encoder: {left_chunks: -2}\n", "left_chunks >= -1"),
        ("model:\n  encoder: {kind: lstm, chunk_frames: 4}\n", "chunk_frames does not apply"),
        ("model:\n  encoder: {kind: lstm, d_model: 144}\n", "d_model does not apply"),
        ("model:\n  encoder: {lstm_units: 64}\n", "lstm_units does not apply.*kind lstm"),
        ("model:\n  encoder: {lstm_units: 320}\n", "lstm_units does not apply"),  # the default
        ("model:\n  encoder: {conv_context: causal}\n", "conv_context does not.*chunk_frames"),
        ("model:\n  encoder: {batch_norm_momentum: 0.9}\n", "momentum does not.*conv_norm"),
        ("model:\n  encoder: {subsampling_factor: 8}\n", "must be 4 with subsampling: valid"),
        ("model:\n  encoder: {subsampling: striding, chunk_frames: 4}\n", "needs subsampling"),
        ("model:\n  encoder: {attention: alibi}\n", "model.encoder.attention must be one of"),
        ("model:\n  encoder: {kind: nemo_conformer}\n", "model.encoder.kind must be one of"),
        ("model:\n  encoder: {dynamic_chunks: 8}\n", "needs model.encoder.chunk_frames > 0"),
        ("model:\n  encoder: {chunk_frames: 4, dynamic_chunks: -1}\n", "dynamic_chunks must be"),
        ("model:\n  encoder: {causal_subsampling: true}\n", "causal_subsampling needs.*striding"),
        ("model:\n  encoder: {lookaheads: [3]}\n", "lookaheads does not.*chunk_frames"),
        ("model:\n  encoder: {chunk_frames: 4, lookaheads: [2, 1]}\n", "first is the default"),
        ("model:\n  encoder: {chunk_frames: 4, lookaheads: [3, -1]}\n", "all >= 0"),
        ("model:\n  encoder: {chunk_frames: 4, lookaheads: [3], dynamic_chunks: 4}\n", "set one"),
        ("loss: {kind: full, sigma: 0.5}\n", r"loss\.sigma applies to loss\.kind tdt only"),
        ("loss: {kind: tdt, prune_range: 3}\n", r"prune_range applies to loss\.kind pruned"),
        ("loss: {kind: pruned, omega: 0.1}\n", r"loss\.omega applies to loss\.kind tdt"),
        ("loss: {kind: tdt, delay_penalty: 0.01}\n", "delay_penalty applies to loss.kind full"),
        (
            "model:\n  predictor: {kind: stateless, num_layers: 2}\n",
            r"predictor\.num_layers applies to model\.predictor\.kind lstm only",
        ),
        (
            "model:\n  predictor: {kind: lstm, context_size: 3}\n",
            r"context_size applies to model\.predictor\.kind stateless",
        ),
    ],
)
def test_bad_configs_name_the_key_and_section(tmp_path, text, message):
    with pytest.raises(ConfigError, match=message):
        load_config(write(tmp_path, text))


def test_bad_override_is_reported():
    with pytest.raises(ConfigError, match="unknown key 'nope'"):
        load_config(None, ["train.nope=1"])
    with pytest.raises(ConfigError, match=r"key\.path=value"):
        load_config(None, ["train.epochs"])


def test_dump_round_trip(tmp_path):
    config = load_config(None, ["data.cmvn=stats.json", "train.clip_global_norm=null"])
    again = load_config(write(tmp_path, dump_config(config)))
    assert again == config
    assert again.train.clip_global_norm is None
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.train.epochs = 5


@pytest.mark.parametrize(
    "overrides",
    [
        ["model.encoder.kind=lstm", "model.encoder.lstm_units=64"],
        ["model.encoder.chunk_frames=8", "model.encoder.conv_context=causal"],
        ["model.encoder.attention=relative", "model.encoder.subsampling=dw_striding",
         "model.encoder.subsampling_factor=8", "model.encoder.conv_norm=frozen_batch",
         "model.encoder.batch_norm_momentum=0.9"],
    ],
    ids=["lstm", "streaming conformer", "nemo options"],
)  # fmt: skip
def test_a_recorded_config_holds_the_encoder_keys_of_its_kind_only(tmp_path, overrides):
    config = load_config(None, overrides)
    recorded = yaml.safe_load(dump_config(config))["model"]["encoder"]
    assert set(recorded) == set(config.model.encoder.applicable_keys())
    assert load_config(write(tmp_path, dump_config(config))) == config
    lstm = config.model.encoder.kind == "lstm"
    assert ("d_model" in recorded) != lstm and ("lstm_units" in recorded) == lstm
    assert ("conv_context" in recorded) == bool(config.model.encoder.chunk_frames)


def test_a_config_starts_from_its_base(tmp_path):
    (tmp_path / "conf").mkdir()
    (tmp_path / "base.yaml").write_text(
        "model:\n  encoder: {kind: conformer, d_model: 64, num_blocks: 3}\n  joint_dim: 99\n"
        "train: {epochs: 7}\n"
    )
    (tmp_path / "conf" / "top.yaml").write_text(
        "base: ../base.yaml\nmodel:\n  encoder: {num_blocks: 5, chunk_frames: 8}\n"
    )
    config = load_config(tmp_path / "conf" / "top.yaml", ["train.epochs=9"])
    encoder = config.model.encoder
    assert (encoder.d_model, encoder.num_blocks, encoder.chunk_frames) == (64, 5, 8)
    assert config.model.joint_dim == 99 and config.train.epochs == 9
    (tmp_path / "a.yaml").write_text("base: b.yaml\n")
    (tmp_path / "b.yaml").write_text("base: a.yaml\n")
    with pytest.raises(ConfigError, match="comes back to itself"):
        load_config(tmp_path / "a.yaml")
    (tmp_path / "c.yaml").write_text("base: nowhere.yaml\n")
    with pytest.raises(FileNotFoundError, match=r"nowhere\.yaml"):
        load_config(tmp_path / "c.yaml")


def test_the_streaming_librispeech_config_is_conformer_s_with_chunks():
    conf = Path(__file__).parents[1] / "recipes" / "librispeech" / "conf"
    streaming = load_config(conf / "conformer_s_streaming.yaml")
    plain = load_config(conf / "conformer_s.yaml")
    assert streaming.model.encoder.chunk_frames == 16 and streaming.model.encoder.left_chunks == 4
    unchunked = dataclasses.replace(streaming.model.encoder, chunk_frames=0, left_chunks=-1)
    assert dataclasses.replace(streaming.model, encoder=unchunked) == plain.model
    assert streaming.train == plain.train and streaming.data == plain.data


def test_a_float_in_exponent_notation_without_a_dot_is_a_float(tmp_path):
    """YAML 1.1 reads `1e-3` as a string; a float key takes it as the number it means, in
    --set and in a file alike, and a word is still refused."""
    from asrkit.config import ConfigError, load_config

    assert load_config(None, ["train.learning_rate=1e-3"]).train.learning_rate == 1e-3
    (tmp_path / "c.yaml").write_text("train:\n  learning_rate: 5E-4\n")
    assert load_config(tmp_path / "c.yaml").train.learning_rate == 5e-4
    with pytest.raises(ConfigError, match="must be float"):
        load_config(None, ["train.learning_rate=fast"])
