"""The mini recipe, every stage, on the tiny corpus with a tiny model (CI smoke test)."""

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TINY_MODEL = [
    "model.encoder.lstm_units=16", "model.encoder.lstm_layers=1",
    "model.encoder.subsampling_filters=8", "model.predictor.units=16",
    "model.predictor.embed_dim=8", "model.joint_dim=16", "train.epochs=1",
    "data.batch_seconds=10", "train.checkpoint_every=2",
]  # fmt: skip


def test_mini_recipe_runs_every_stage_and_reruns_nothing(tmp_path):
    asrkit = Path(sys.executable).parent / "asrkit"
    env = dict(os.environ, ASRKIT=str(asrkit), ASRKIT_NO_APT="1")
    cmd = ["bash", str(ROOT / "recipes/mini/run.sh"), "--work", str(tmp_path / "w"),
           "--preset", "tiny"]  # fmt: skip
    for item in TINY_MODEL:
        cmd += ["--set", item]
    first = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert first.returncode == 0, first.stdout[-2000:] + first.stderr[-3000:]
    work = tmp_path / "w"
    for n in range(6):
        assert (work / ".done" / str(n)).exists()
    assert "WER" in (work / "exp/decode_test/report.txt").read_text()
    assert (work / "exp/decode_test/hypotheses.txt").read_text().startswith("REF:")
    again = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)
    assert again.returncode == 0
    assert again.stdout.count("done before, skipped") == 6
