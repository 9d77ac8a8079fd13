"""NeMo's log-mel front end: asrkit's TensorFlow version against NeMo's own output on real
speech (fixtures made by NeMo, tools/make_nemo_fixtures.py), and its filterbank against
the checkpoint buffer NeMo computed with librosa."""

import json
from pathlib import Path

import numpy as np
import pytest
import soundfile

from asrkit.nemo_mel import NemoMelSettings, nemo_log_mel, slaney_mel_filterbank, symmetric_hann

ROOT = Path(__file__).resolve().parents[1]
NEMO = ROOT / "tests" / "data" / "nemo"


def _settings(nemo: dict) -> NemoMelSettings:
    rate = nemo["sample_rate"]
    win = int(nemo["window_size"] * rate)
    n_fft = nemo["n_fft"] or 2 ** int(np.ceil(np.log2(win)))
    return NemoMelSettings(
        sample_rate=rate, win_length=win, hop_length=int(nemo["window_stride"] * rate),
        n_fft=n_fft, num_mel_bins=nemo["features"], lowfreq=nemo.get("lowfreq", 0.0),
        highfreq=nemo.get("highfreq"),
        normalize="per_feature" if nemo["normalize"] == "per_feature" else "none",
        pad_to=nemo["pad_to"],
    )  # fmt: skip


@pytest.fixture(scope="module")
def reference():
    record = json.loads((NEMO / "features.json").read_text())
    waves = [soundfile.read(ROOT / clip, dtype="float32")[0] for clip in record["clips"]]
    lengths = np.array([len(w) for w in waves])
    batch = np.zeros((len(waves), lengths.max()), np.float32)
    for i, wave in enumerate(waves):
        batch[i, : len(wave)] = wave
    return record["settings"], batch, lengths, np.load(NEMO / "features.npz")


@pytest.mark.parametrize("name", ["conformer", "variant"])
def test_features_equal_nemos_on_real_speech(reference, name):
    settings, batch, lengths, nemo = reference
    s = _settings(settings[name])
    want = nemo[f"{name}/features"].transpose(0, 2, 1)  # NeMo's [B, F, T] -> [B, T, F]
    for filterbank in (None, nemo[f"{name}/fb"]):  # computed here, or the checkpoint's
        got, frames = nemo_log_mel(batch, lengths, s, filterbank=filterbank)
        np.testing.assert_array_equal(frames.numpy(), nemo[f"{name}/lengths"])
        assert got.shape == want.shape
        np.testing.assert_allclose(got.numpy(), want, atol=1e-4, rtol=0)


@pytest.mark.parametrize("name", ["conformer", "variant"])
def test_the_filterbank_and_window_are_nemos(reference, name):
    settings, _, _, nemo = reference
    s = _settings(settings[name])
    np.testing.assert_allclose(slaney_mel_filterbank(s), nemo[f"{name}/fb"], atol=1e-7, rtol=0)
    np.testing.assert_allclose(symmetric_hann(s.win_length), nemo[f"{name}/window"], atol=1e-6)
