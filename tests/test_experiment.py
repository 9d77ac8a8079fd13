"""Experiment directories across asrkit versions: a resume that would build another network
than the one the checkpoints hold is refused before anything is written."""

import pytest

from asrkit.checkpoints import CheckpointManager, TrainState
from asrkit.cli.main import main
from asrkit.config import EncoderConfig, ExperimentConfig, ModelConfig, dump_config
from asrkit.models.transducer import Transducer

ENCODER = dict(kind="conformer", d_model=16, num_blocks=1, num_heads=2, kernel_size=5,
               subsampling_filters=8, dropout=0.0)  # fmt: skip


def test_resuming_an_experiment_trained_before_final_norm_names_the_key(tmp_path, capsys):
    exp = tmp_path / "exp"
    model = ModelConfig(encoder=EncoderConfig(**ENCODER, final_norm="block"), joint_dim=16)
    recorded = dump_config(ExperimentConfig(model=model)).replace("    final_norm: block\n", "")
    exp.mkdir()
    (exp / "config.yaml").write_text(recorded)
    network = Transducer(9, model)
    network.build_from_features(80)
    CheckpointManager(exp / "checkpoints", keep=1).save(network, TrainState(1, 0, 5))
    before = (exp / "config.yaml").read_text()
    # The user's own config of before (no final_norm), which today reads as the default.
    conf = tmp_path / "conf.yaml"
    conf.write_text("model:\n  encoder:\n" + "".join(f"    {k}: {v}\n" for k, v in ENCODER.items()))
    argv = ["train", "--config", str(conf), "--exp-dir", str(exp),
            "--set", f"data.tokenizer={tmp_path}/tok"]  # fmt: skip
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "model.encoder.final_norm=block" in err[0], err
    assert "this run asks for none" in err[0]
    assert (exp / "config.yaml").read_text() == before  # nothing rewritten
    # With the recorded value the check passes: the next error is the missing tokenizer.
    assert main([*argv, "--set", "model.encoder.final_norm=block"]) == 2
    assert "tok/tokenizer.model missing" in capsys.readouterr().err
    # Without --config the experiment's own record is used: it keeps "block", no refusal.
    assert main(["train", "--exp-dir", str(exp), "--set", f"data.tokenizer={tmp_path}/tok"]) == 2
    assert "tok/tokenizer.model missing" in capsys.readouterr().err


def test_a_resume_checks_conv_context_only_where_it_builds_something(tmp_path):
    """conv_context only shapes a chunked Conformer: an old full-context experiment resumes
    with today's default; an old chunked one must keep "causal"."""
    from asrkit.config import load_config
    from asrkit.experiment import ExperimentError, check_resumable

    for chunk_frames, refused in ((0, False), (4, True)):
        exp = tmp_path / f"exp{chunk_frames}"
        encoder = EncoderConfig(**ENCODER, final_norm="none", chunk_frames=chunk_frames,
                                conv_context="causal")  # fmt: skip
        model = ModelConfig(encoder=encoder, joint_dim=16)
        exp.mkdir()
        recorded = dump_config(ExperimentConfig(model=model))
        (exp / "config.yaml").write_text(recorded.replace("    conv_context: causal\n", ""))
        network = Transducer(9, model)
        network.build_from_features(80)
        CheckpointManager(exp / "checkpoints", keep=1).save(network, TrainState(1, 0, 5))
        today = load_config(None, [f"model.encoder.{k}={v}" for k, v in ENCODER.items()]
                            + ["model.encoder.final_norm=none",
                               f"model.encoder.chunk_frames={chunk_frames}"])  # fmt: skip
        assert today.model.encoder.conv_context == "chunk"
        if refused:
            with pytest.raises(ExperimentError, match=r"model\.encoder\.conv_context=causal"):
                check_resumable(today, exp)
        else:
            check_resumable(today, exp)
