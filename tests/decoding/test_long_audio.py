"""Long recordings: cuts fall in pauses, and windows joined by time neither lose nor repeat
a word — checked with a recogniser whose every answer is known (tone bursts), then with a
real clip concatenated with itself."""

from pathlib import Path

import numpy as np
import pytest
import soundfile

from asrkit.config import FeatureConfig
from asrkit.decoding.long_audio import Windowing, cut_points, plan_windows
from asrkit.decoding.search import Hypothesis
from asrkit.decoding.transcribe import Decoded, transcribe_files
from asrkit.decoding.words import Alignment, FrameClock, Word

RATE = 16_000
LEVELS = (0.1, 0.2, 0.3, 0.4, 0.5)  # a burst's amplitude names its word


def bursts(seed, count=30):
    """A recording of tone bursts (0.15-0.6 s) separated by pauses (0.05-0.7 s) with a
    faint noise floor; returns the samples and each burst's (onset seconds, level index)."""
    rng = np.random.default_rng(seed)
    pieces, truth, position = [], [], 0
    for _ in range(count):
        pause = int(rng.uniform(0.05, 0.7) * RATE)
        length = int(rng.uniform(0.15, 0.6) * RATE)
        level = int(rng.integers(len(LEVELS)))
        tone = LEVELS[level] * np.sin(2 * np.pi * 440 * np.arange(length) / RATE)
        pieces += [np.zeros(pause), tone]
        truth.append((round((position + pause) / RATE, 4), level))
        position += pause + length
    pieces.append(np.zeros(int(0.3 * RATE)))
    samples = np.concatenate(pieces).astype(np.float32)
    samples += 1e-4 * rng.standard_normal(samples.size).astype(np.float32)
    return samples, truth


class BurstRecogniser:
    """Finds whole bursts in a waveform: a word per burst, at its onset (a burst cut by
    the window's edge is still reported — at the edge, as a model would half-hear it)."""

    sample_rate = RATE
    clock = FrameClock.of(FeatureConfig())

    def __call__(self, waveforms):
        return [self.one(w) for w in waveforms]

    def one(self, samples):
        loud = np.abs(samples) > 0.05
        loud = np.convolve(loud, np.ones(160), mode="same") > 0  # bridge the zero crossings
        edges = np.flatnonzero(np.diff(np.r_[0, loud.astype(int), 0]))
        words, tokens, frames = [], [], []
        for onset, offset in zip(edges[::2], edges[1::2], strict=True):
            peak = np.max(np.abs(samples[onset:offset]))
            level = int(np.argmin([abs(peak - v) for v in LEVELS]))
            frame = max(0, round((onset / RATE - self.clock.offset) / self.clock.period))
            start = self.clock.offset + frame * self.clock.period
            words.append(Word(f"W{level}", start, offset / RATE, 1.0))
            tokens.append(level + 1)
            frames.append(frame)
        best = Hypothesis(tokens, frames, 0.0, " ".join(w.text for w in words), [0.0] * len(words))
        return Decoded(best, Alignment(words, list(range(len(words)))), [best])


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_cuts_fall_in_pauses_and_segments_fit(seed):
    samples, _truth = bursts(seed)
    windowing = Windowing(max_seconds=4.0, context_seconds=0.5, search_seconds=1.5)
    cuts = cut_points(samples, RATE, windowing)
    assert cuts[0] == 0 and cuts[-1] == len(samples) and len(cuts) > 4
    assert max(np.diff(cuts)) <= 4.0 * RATE
    loud = np.abs(samples) > 0.05
    for cut in cuts[1:-1]:
        assert not loud[cut - 80 : cut + 80].any(), f"cut at {cut / RATE:.2f} s is inside a burst"


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_windows_join_every_word_once(seed, tmp_path):
    samples, truth = bursts(seed)
    path = tmp_path / "long.wav"
    soundfile.write(path, samples, RATE)
    windowing = Windowing(max_seconds=4.0, context_seconds=0.8, search_seconds=1.5)
    [found] = transcribe_files(BurstRecogniser(), [path], windowing=windowing)
    assert found.windows == len(plan_windows(samples, RATE, windowing)) > 4
    assert [w.text for w in found.words] == [f"W{level}" for _, level in truth]
    clock = BurstRecogniser.clock
    for word, (onset, _) in zip(found.words, truth, strict=True):
        assert abs(word.start - onset) <= clock.period  # times count from the file's start
    # The joined hypothesis carries the kept words' tokens, frames from the file's start.
    assert found.hypothesis.tokens == [level + 1 for _, level in truth]
    starts = [clock.offset + f * clock.period for f in found.hypothesis.frames]
    assert starts == pytest.approx([w.start for w in found.words], abs=1e-6)
    assert found.text == " ".join(w.text for w in found.words)


def test_a_short_file_is_one_window_with_its_nbest(tmp_path):
    samples, truth = bursts(3, count=4)
    path = tmp_path / "short.wav"
    soundfile.write(path, samples, RATE)
    [found] = transcribe_files(BurstRecogniser(), [path])
    assert found.windows == 1 and len(found.nbest) == 1
    assert [w.text for w in found.words] == [f"W{level}" for _, level in truth]


def test_windowing_settings_are_checked():
    with pytest.raises(ValueError, match="search_seconds"):
        Windowing(max_seconds=4.0, search_seconds=3.0)
    with pytest.raises(ValueError):
        Windowing(max_seconds=0.0)


REAL = Path(__file__).parents[1] / "data" / "realspeech" / "test-real" / "9002" / "90021"


@pytest.mark.parametrize("name", ["9002-90021-0001", "9002-90021-0004"])
def test_a_real_clip_repeated_is_cut_between_its_copies(name):
    """Real read speech has pauses inside sentences too; the cuts still pick the pauses
    between the copies (each the quietest stretch in its search range)."""
    clip, rate = soundfile.read(REAL / f"{name}.flac", dtype="float32")
    copies = 5
    duration = len(clip) / rate
    windowing = Windowing(
        max_seconds=1.3 * duration, context_seconds=0.5, search_seconds=0.6 * duration
    )
    cuts = cut_points(np.tile(clip, copies), rate, windowing)
    assert len(cuts) == copies + 1
    for k, cut in enumerate(cuts[1:-1], start=1):
        assert abs(cut / rate - k * duration) < 0.25, (k, cut / rate)
