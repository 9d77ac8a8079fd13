"""The long-audio windows in NumPy, as a test oracle for the recogniser's graph
(`asrkit.decoding.windows_graph`, `Recogniser.windowed`): the cuts at the quietest points,
the windows around the segments, and the join that keeps each window's words (and their
tokens) where they start inside its segment; `transcribe_in_windows` decodes a recording
window by window with any recogniser and joins the results so."""

from __future__ import annotations

import itertools
from dataclasses import dataclass, replace

import numpy as np

from asrkit.decoding.long_audio import ENERGY_HOP_SECONDS, Windowing
from asrkit.decoding.search.front import Hypothesis
from asrkit.decoding.transcribe import Transcript
from asrkit.decoding.words import Word


@dataclass(frozen=True)
class Window:
    start: int  # samples of the recording decoded for this window: [start, end)
    end: int
    keep_from: float  # seconds (of the recording): words starting in [keep_from, keep_to)
    keep_to: float


def cut_points(samples: np.ndarray, rate: int, windowing: Windowing) -> list[int]:
    """Sample positions of the cuts: [0, c1, ..., len(samples)], each segment no longer
    than `windowing.max_seconds`."""
    total = len(samples)
    limit = int(windowing.max_seconds * rate)
    if total <= limit:
        return [0, total]
    hop = max(1, int(ENERGY_HOP_SECONDS * rate))
    usable = total // hop * hop
    power = np.mean(np.square(samples[:usable].astype(np.float64)).reshape(-1, hop), axis=1)
    width = max(1, round(windowing.smooth_seconds / ENERGY_HOP_SECONDS))
    smooth = np.convolve(power, np.ones(width) / width, mode="same")
    search = int(windowing.search_seconds * rate)
    cuts = [0]
    while total - cuts[-1] > limit:
        lo = (cuts[-1] + limit - search) // hop
        hi = min((cuts[-1] + limit) // hop, len(smooth))
        quietest = lo + int(np.argmin(smooth[lo:hi]))  # the first of equally quiet frames
        cuts.append(quietest * hop + hop // 2)
    return [*cuts, total]


def plan_windows(
    samples: np.ndarray, rate: int, windowing: Windowing, step: int = 1
) -> list[Window]:
    """The windows to decode; each starts on a multiple of `step` samples (an encoder
    frame, so token frames shift exactly)."""
    cuts = cut_points(samples, rate, windowing)
    context = int(windowing.context_seconds * rate)
    last = len(cuts) - 2
    return [
        Window(
            start=max(a - context, 0) // step * step,
            end=min(b + context, len(samples)),
            keep_from=a / rate if i > 0 else -np.inf,
            keep_to=b / rate if i < last else np.inf,
        )
        for i, (a, b) in enumerate(itertools.pairwise(cuts))
    ]


def join_words(windows: list[Window], words: list[list[Word]], rate: int) -> list[Word]:
    """Each window's words (times relative to the window) -> the recording's words: shifted
    to the recording's time and kept where their start falls in the window's segment."""
    joined = []
    for window, found in zip(windows, words, strict=True):
        shift = window.start / rate
        for word in found:
            start = word.start + shift
            if window.keep_from <= start < window.keep_to:
                joined.append(Word(word.text, start, word.end + shift, word.confidence))
    return joined


def join_tokens(windows: list[Window], decoded: list, period: float, rate: int) -> Hypothesis:
    """The tokens of the words each window keeps, with frames counted from the recording's
    start; the score is the windows' sum."""
    tokens, frames, score = [], [], 0.0
    for window, found in zip(windows, decoded, strict=True):
        shift = window.start / rate
        kept = {
            i
            for i, word in enumerate(found.alignment.words)
            if window.keep_from <= word.start + shift < window.keep_to
        }
        offset = round(shift / period)  # exact: windows start on encoder frames
        for token, frame, word in zip(
            found.best.tokens, found.best.frames, found.alignment.token_words, strict=True
        ):
            if word in kept:
                tokens.append(token)
                frames.append(frame + offset)
        score += found.best.score
    return Hypothesis(tokens, frames, score, "")


def transcribe_in_windows(recognise, samples: np.ndarray, windowing: Windowing) -> Transcript:
    """`samples` cut into `windowing`'s windows, each decoded alone by `recognise` (a
    recogniser of `asrkit.decoding.transcribe` that decodes them whole), and joined."""
    rate = recognise.sample_rate
    windows = plan_windows(samples, rate, windowing, round(recognise.clock.period * rate))
    decoded = [recognise([samples[w.start : w.end]])[0] for w in windows]
    words = join_words(windows, [d.alignment.words for d in decoded], rate)
    joined = join_tokens(windows, decoded, recognise.clock.period, rate)
    text = " ".join(w.text for w in words)
    return Transcript("", replace(joined, text=text), words, [], len(samples) / rate,
                      len(windows))  # fmt: skip
