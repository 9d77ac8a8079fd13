"""Reading audio with soundfile, resampling with soxr. No TensorFlow here."""

from __future__ import annotations

import io
import os
from collections import Counter
from dataclasses import dataclass

import numpy as np
import soundfile

from asrkit.errors import UserError

SAMPLE_RATE = 16_000

# (sample rate, channels) -> how many files `read_audio` converted from that format in this
# process; `conversion_notice` turns it into the one line a command prints at its end.
CONVERTED: Counter[tuple[int, int]] = Counter()


@dataclass(frozen=True)
class AudioInfo:
    sample_rate: int
    num_samples: int
    channels: int

    @property
    def duration(self) -> float:
        return self.num_samples / self.sample_rate


class AudioError(UserError, ValueError):
    """Audio that cannot be used: unreadable, corrupt, or in an unexpected format."""


def _check_exists(path) -> None:
    if not os.path.isfile(path):  # libsndfile would say "System error."
        raise AudioError(f"{path}: no such audio file")


def audio_info(path: str | os.PathLike) -> AudioInfo:
    _check_exists(path)
    try:
        info = soundfile.info(str(path))
    except (soundfile.LibsndfileError, RuntimeError, OSError) as err:
        raise AudioError(f"{path}: cannot read audio ({err})") from None
    return AudioInfo(int(info.samplerate), int(info.frames), int(info.channels))


def read_audio(
    path: str | os.PathLike,
    sample_rate: int = SAMPLE_RATE,
    offset: float | None = None,
    duration: float | None = None,
    data: bytes | None = None,
) -> np.ndarray:
    """Mono float32 samples in [-1, 1] at `sample_rate` (resampled with soxr if needed).
    With `offset` (seconds): only the segment [offset, offset + duration) is read from the
    file (to its end without `duration`), as a NeMo manifest's segment entry asks. With
    `data`: the audio file's bytes (a tar member), `path` naming it in messages."""
    if data is None:
        _check_exists(path)
    source = str(path) if data is None else io.BytesIO(data)
    try:
        if offset is None:
            samples, rate = soundfile.read(source, dtype="float32", always_2d=True)
        else:
            rate = soundfile.info(source).samplerate
            if data is not None:
                source.seek(0)
            start = round(offset * rate)
            frames = -1 if duration is None else round(duration * rate)
            samples, rate = soundfile.read(
                source, start=start, frames=frames, dtype="float32", always_2d=True
            )
            if not len(samples):
                raise AudioError(f"{path}: no audio at offset {offset} s (past the file's end?)")
    except (soundfile.LibsndfileError, RuntimeError, OSError) as err:
        raise AudioError(f"{path}: cannot read audio ({err})") from None
    if rate != sample_rate or samples.shape[1] > 1:
        CONVERTED[(int(rate), int(samples.shape[1]))] += 1
    samples = samples.mean(axis=1) if samples.shape[1] > 1 else samples[:, 0]
    if rate != sample_rate:
        samples = resample(samples, rate, sample_rate)
    return samples


def conversion_notice(sample_rate: int = SAMPLE_RATE) -> str | None:
    """One line on the audio this process converted (None if it converted none)."""
    if not CONVERTED:
        return None
    kinds = ", ".join(
        f"{count} at {rate} Hz {'mono' if channels == 1 else f'{channels} channels'}"
        for (rate, channels), count in sorted(CONVERTED.items())
    )
    line = (
        f"{sum(CONVERTED.values())} audio file(s) converted to {sample_rate // 1000} kHz mono "
        f"({kinds})"
    )
    if any(rate < sample_rate for rate, _ in CONVERTED):
        line += f"; audio below {sample_rate // 1000} kHz lacks the high band the model was "
        line += "trained on: expect lower accuracy"
    return line


def resample(samples: np.ndarray, rate_in: int, rate_out: int) -> np.ndarray:
    import soxr

    return soxr.resample(samples, rate_in, rate_out, quality="HQ").astype(np.float32)
