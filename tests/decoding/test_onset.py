"""The emission delay: speech onsets where the signal says, and the delay of a recogniser
whose delay is known, measured back to within the clock's resolution."""

from pathlib import Path

import numpy as np
import pytest
import soundfile

from asrkit.audio import read_audio
from asrkit.config import FeatureConfig
from asrkit.decoding.onset import ImplausibleDelay, measure_emission_delay, speech_onset
from asrkit.decoding.search.front import Hypothesis
from asrkit.decoding.transcribe import Decoded
from asrkit.decoding.words import Alignment, FrameClock, Word
from asrkit.errors import InputError

RATE = 16_000
REAL = Path(__file__).parents[1] / "data" / "realspeech" / "test-real" / "9002" / "90021"


def noise(seconds, level, rng):
    return level * rng.standard_normal(int(seconds * RATE)).astype(np.float32)


def syllables(seconds, level, rng):
    """Speech-like sound: noise under a 4 Hz syllable envelope that starts at full level."""
    t = np.arange(int(seconds * RATE)) / RATE
    envelope = 0.55 + 0.45 * np.cos(2 * np.pi * 4 * t)
    return (level * envelope * rng.standard_normal(t.size)).astype(np.float32)


@pytest.mark.parametrize("lead,level", [(0.37, 0.3), (0.05, 0.3), (1.2, 0.02)])
def test_the_onset_is_where_the_speech_begins(lead, level):
    rng = np.random.default_rng(7)
    samples = np.concatenate([noise(lead, 1e-4, rng), syllables(1.5, level, rng)])
    assert speech_onset(samples, RATE) == pytest.approx(lead, abs=0.011)


def test_no_onset_in_silence_or_a_steady_noise():
    rng = np.random.default_rng(1)
    assert speech_onset(np.zeros(RATE, np.float32), RATE) is None
    assert speech_onset(noise(2.0, 0.01, rng), RATE) is None
    assert speech_onset(np.zeros(10, np.float32), RATE) is None


@pytest.mark.parametrize("name", ["9002-90021-0000", "9002-90021-0001", "9002-90021-0004"])
def test_a_real_clip_with_more_of_its_own_pause_moves_its_onset_as_much(name):
    """A recording's floor is its own room and microphone: 0.4 s more of the clip's own
    leading pause moves the onset by 0.4 s."""
    clip = read_audio(REAL / f"{name}.flac")
    own = speech_onset(clip, RATE)
    assert own is not None and 0.15 < own < 1.0
    pause = clip[: int(0.1 * RATE)]
    moved = speech_onset(np.concatenate([np.tile(pause, 4), clip]), RATE)
    assert moved == pytest.approx(own + 0.4, abs=0.011)


class LateRecogniser:
    """Emits one word per waveform, `delay` seconds after the first sample louder than 0.05
    (found its own way), at the nearest encoder frame."""

    sample_rate = RATE
    window_samples = 30 * RATE  # longer recordings would be decoded in windows

    def __init__(self, delay, clock_delay=0.0):
        self.delay = delay
        self.clock = FrameClock.of(FeatureConfig(), clock_delay)

    def __call__(self, waveforms):
        out = []
        for samples in waveforms:
            loud = np.flatnonzero(np.abs(samples) > 0.05)
            if not len(loud):
                empty = Hypothesis([], [], 0.0, "")
                out.append(Decoded(empty, Alignment([], []), [empty]))
                continue
            at = loud[0] / RATE + self.delay
            frame = round((at - self.clock.offset) / self.clock.period)
            start = float(self.clock.seconds(frame))
            best = Hypothesis([1], [frame], 0.0, "W", [0.0])
            out.append(Decoded(best, Alignment([Word("W", start, start + 0.1, 1.0)], [0]), [best]))
        return out


def _quiet_then_speech(tmp_path, count=9):
    """Files with random quiet leads and levels, and one silent file."""
    rng = np.random.default_rng(3)
    paths = []
    for i in range(count):
        samples = np.concatenate(
            [noise(rng.uniform(0.1, 0.8), 1e-4, rng), syllables(1.0, rng.uniform(0.2, 0.5), rng)]
        )
        paths.append(tmp_path / f"{i}.wav")
        soundfile.write(paths[-1], samples, RATE)
    soundfile.write(tmp_path / "silent.wav", np.zeros(RATE, np.float32), RATE)
    return [*paths, tmp_path / "silent.wav"]


@pytest.mark.parametrize("delay", [0.0, 0.12, 0.3])
def test_a_known_delay_is_measured_back(tmp_path, delay):
    """The measured delay is the recogniser's own (within half a frame and one onset
    step), 0 included."""
    found = measure_emission_delay(LateRecogniser(delay), _quiet_then_speech(tmp_path))
    assert found.seconds == pytest.approx(delay, abs=0.02 + 0.011)
    assert found.utterances == 9 and found.skipped == 1
    assert 0 <= found.spread <= 0.04


@pytest.mark.parametrize(("delay", "message"), [(-0.27, "before the speech"), (1.5, "after")])
def test_a_delay_no_timed_model_has_is_refused(tmp_path, delay, message):
    """Words before the speech begins (the -270 ms of a model that put every word in the
    first 0.32 s), or seconds after it: refused with what it means, never stored."""
    with pytest.raises(ImplausibleDelay, match=f"{message}.*median over 9 recordings"):
        measure_emission_delay(LateRecogniser(delay), _quiet_then_speech(tmp_path))


def test_a_clock_that_already_has_a_delay_is_refused(tmp_path):
    with pytest.raises(ValueError, match="a clock that has none"):
        measure_emission_delay(LateRecogniser(0.1, clock_delay=0.05), [tmp_path / "x.wav"])


def test_nothing_to_measure_is_an_input_error(tmp_path):
    soundfile.write(tmp_path / "silent.wav", np.zeros(RATE, np.float32), RATE)
    with pytest.raises(InputError, match="none of the 1 recordings"):
        measure_emission_delay(LateRecogniser(0.1), [tmp_path / "silent.wav"])


def test_the_clock_subtracts_the_delay_and_never_goes_below_zero():
    clock = FrameClock.of(FeatureConfig(), 0.06)
    got = clock.seconds(np.array([0, 1, 2, 10])).numpy()
    want = np.maximum(0.0, 0.0425 - 0.06 + 0.04 * np.array([0, 1, 2, 10]))
    np.testing.assert_allclose(got, want, atol=1e-6)
