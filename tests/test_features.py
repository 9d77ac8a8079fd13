"""Log-mel features: frame-count formula against real output, values against a NumPy mel."""

from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf
from hypothesis import given, settings
from hypothesis import strategies as st

from asrkit.audio import read_audio
from asrkit.config import FeatureConfig
from asrkit.features import GlobalNormalizer, encoder_frames, log_mel, num_frames, perturb_speed

REAL = Path(__file__).parent / "data" / "realspeech" / "test-real" / "9002" / "90021"


@settings(max_examples=30, deadline=None)
@given(st.integers(0, 4000))
def test_frame_count_formula_matches_stft_output(n):
    samples = np.random.default_rng(n).uniform(-1, 1, n).astype(np.float32)
    features = log_mel(samples)
    assert features.shape == (num_frames(n), 80)
    assert int(num_frames(tf.constant(n))) == num_frames(n) == int(num_frames(np.array([n]))[0])


def test_log_mel_matches_a_numpy_filterbank():
    rate, config = 16000, FeatureConfig()
    t = np.arange(rate) / rate
    samples = (0.5 * np.sin(2 * np.pi * 1000 * t)).astype(np.float32)
    got = log_mel(samples).numpy()
    # Independent NumPy STFT with the same (periodic) Hann window and TF's mel matrix.
    window = 0.5 - 0.5 * np.cos(2 * np.pi * np.arange(400) / 400)
    frames = np.stack([samples[i : i + 400] * window for i in range(0, rate - 400 + 1, 160)])
    power = np.abs(np.fft.rfft(frames, n=512)) ** 2
    weights = tf.signal.linear_to_mel_weight_matrix(80, 257, rate, 20.0, 7600.0).numpy()
    want = np.log(power @ weights + config.log_floor)
    np.testing.assert_allclose(got, want, atol=2e-3)
    # A 1 kHz tone puts its energy in the mel bin whose centre is nearest 1 kHz.
    mel_of = lambda hz: 1127.0 * np.log1p(hz / 700.0)  # noqa: E731
    centres = np.linspace(mel_of(20.0), mel_of(7600.0), 82)[1:-1]
    assert np.argmax(got.mean(0)) == np.argmin(np.abs(centres - mel_of(1000.0)))


def test_real_recording_features():
    samples = read_audio(REAL / "9002-90021-0001.flac")
    feats = log_mel(samples).numpy()
    assert feats.shape == (num_frames(len(samples)), 80)
    assert np.isfinite(feats).all()
    # Speech is louder in its active frames than in its quietest ones.
    energy = feats.mean(1)
    assert np.percentile(energy, 90) - np.percentile(energy, 10) > 3.0


@pytest.mark.parametrize("factor", [0.9, 1.1])
def test_speed_perturbation_changes_length_and_pitch(factor):
    rate = 16000
    t = np.arange(rate) / rate
    tone = np.sin(2 * np.pi * 500 * t).astype(np.float32)
    out = perturb_speed(tone, factor)
    assert len(out) == pytest.approx(rate / factor, abs=2)
    peak_hz = np.argmax(np.abs(np.fft.rfft(out))) * rate / len(out)
    assert peak_hz == pytest.approx(500 * factor, rel=0.01)


def test_global_normalizer_standardises_its_training_data():
    rng = np.random.default_rng(0)
    batches = [rng.normal(3.0, 2.0, size=(rng.integers(5, 50), 80)) for _ in range(20)]
    norm = GlobalNormalizer.fit(batches)
    joined = np.concatenate(batches)
    out = norm(tf.constant(joined, tf.float32)).numpy()
    np.testing.assert_allclose(out.mean(0), 0.0, atol=1e-4)
    np.testing.assert_allclose(out.std(0), 1.0, atol=1e-4)
    again = GlobalNormalizer.from_dict(norm.to_dict())
    np.testing.assert_array_equal(again.mean, norm.mean)


def test_config_validates():
    with pytest.raises(ValueError, match="frame_step"):
        FeatureConfig(frame_step=500)


@pytest.mark.parametrize("frames", [0, 1, 3, 6, 7, 10, 43, 100, 401])
def test_encoder_frames_matches_two_valid_stride_2_convolutions(frames):
    out = tf.ones([1, frames, 1])
    for _ in range(2):  # what ConvSubsampling does along time
        if out.shape[1] < 3:
            out = tf.zeros([1, 0, 1])
            break
        out = tf.nn.conv1d(out, tf.ones([3, 1, 1]), stride=2, padding="VALID")
    want = out.shape[1]
    assert encoder_frames(frames) == want
    assert int(encoder_frames(tf.constant(frames))) == want
    assert int(encoder_frames(np.array([frames]))[0]) == want
