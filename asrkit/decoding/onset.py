"""A model's emission delay, measured from where speech begins in ordinary recordings.

A transducer emits a token once it has heard enough of it, so the frame that emits a
word's first token lies some tens of milliseconds after the word begins. Any recording
that starts with a little silence shows this without a reference alignment: the first
word cannot begin before the speech does. The delay is the median, over utterances, of
the first word's start (the centre of the audio of the frame that emitted its first
token with text: `FrameClock` without a delay) minus the speech onset, the first 10 ms
frame whose energy comes within `ONSET_BELOW_PEAK_DB` of the loudest frame and
`ONSET_ABOVE_FLOOR_DB` above the quiet floor. `asrkit calibrate` stores it in the
experiment; the clock subtracts it from every token and word time (`FrameClock.delay`).
Words inside an utterance come out later than the first one (by ~40 ms on the mini
recipe's models, RESULTS.md), so this removes most of the bias, not all of
it.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from asrkit.errors import InputError

ONSET_HOP_SECONDS = 0.01
ONSET_BELOW_PEAK_DB = 35.0
ONSET_ABOVE_FLOOR_DB = 12.0
FLOOR_PERCENTILE = 10
# A delay outside these bounds is not a transducer's emission delay but a model that does
# not place words in time (untrained, or trained on other audio): it is refused, not stored.
# A word cannot be emitted before the speech begins (less an onset frame's 10 ms and a
# 20 ms half-frame of slack), nor a second after it began.
PLAUSIBLE_DELAY_SECONDS = (-0.03, 1.0)


class ImplausibleDelay(InputError):
    """A measured delay no correctly timed model has; the message says what it means."""


@dataclass(frozen=True)
class EmissionDelay:
    seconds: float  # median of first-word time - speech onset
    utterances: int  # utterances measured (a first word and a speech onset)
    skipped: int  # utterances without recognised words or without a quiet-to-speech onset
    spread: float  # the interquartile range of the per-utterance delays, seconds


def speech_onset(samples: np.ndarray, rate: int) -> float | None:
    """Seconds where speech starts: the first 10 ms frame at most `ONSET_BELOW_PEAK_DB`
    below the loudest and `ONSET_ABOVE_FLOOR_DB` above the floor (the 10th percentile
    frame); None for a recording without such a rise (silence, or a steady sound)."""
    hop = max(1, round(ONSET_HOP_SECONDS * rate))
    usable = len(samples) // hop * hop
    if usable == 0:
        return None
    frames = np.asarray(samples[:usable], np.float64).reshape(-1, hop)
    level = 10 * np.log10(np.mean(np.square(frames), axis=1) + 1e-12)
    floor = np.percentile(level, FLOOR_PERCENTILE)
    threshold = max(level.max() - ONSET_BELOW_PEAK_DB, floor + ONSET_ABOVE_FLOOR_DB)
    if level.max() < threshold:
        return None
    return float(np.argmax(level >= threshold) * hop / rate)


def measure_emission_delay(recognise, paths: list[str | Path]) -> EmissionDelay:
    """The emission delay of `recognise` (a recogniser of `asrkit.decoding.transcribe`
    whose clock has no delay yet) over the audio files `paths`: each transcript's first
    word against the file's speech onset."""
    from asrkit.audio import read_audio
    from asrkit.decoding.transcribe import transcribe_files

    if recognise.clock.delay:
        raise ValueError("measure the emission delay with a clock that has none")
    rate = recognise.sample_rate
    found = transcribe_files(recognise, paths)
    delays = []
    for transcript in found:
        onset = speech_onset(read_audio(transcript.path, rate), rate)
        if onset is None or not transcript.words:
            continue
        delays.append(transcript.words[0].start - onset)
    if not delays:
        raise InputError(
            f"none of the {len(paths)} recordings has both recognised words and a quiet "
            "start followed by speech; calibrate on held-out recordings the model transcribes"
        )
    quartiles = statistics.quantiles(delays, n=4) if len(delays) > 1 else [delays[0]] * 3
    delay = EmissionDelay(
        seconds=float(statistics.median(delays)),
        utterances=len(delays),
        skipped=len(found) - len(delays),
        spread=float(quartiles[2] - quartiles[0]),
    )
    check_plausible(delay)
    return delay


def check_plausible(delay: EmissionDelay) -> None:
    """`ImplausibleDelay` for a delay outside `PLAUSIBLE_DELAY_SECONDS`."""
    low, high = PLAUSIBLE_DELAY_SECONDS
    ms = delay.seconds * 1000
    if delay.seconds < low:
        raise ImplausibleDelay(
            f"the first words come {-ms:.0f} ms before the speech begins (median over "
            f"{delay.utterances} recordings): this model does not place its words in time, so "
            "there is no delay to store; calibrate a model that transcribes these recordings"
        )
    if delay.seconds > high:
        raise ImplausibleDelay(
            f"the first words come {ms:.0f} ms after the speech begins (median over "
            f"{delay.utterances} recordings), more than a model waits: it misses or misplaces "
            "the first words; nothing stored"
        )
