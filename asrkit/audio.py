"""Reading audio with soundfile, resampling with soxr. No TensorFlow here."""

from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np
import soundfile

from asrkit.errors import UserError

SAMPLE_RATE = 16_000


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


def read_audio(path: str | os.PathLike, sample_rate: int = SAMPLE_RATE) -> np.ndarray:
    """Mono float32 samples in [-1, 1] at `sample_rate` (resampled with soxr if needed)."""
    _check_exists(path)
    try:
        samples, rate = soundfile.read(str(path), dtype="float32", always_2d=True)
    except (soundfile.LibsndfileError, RuntimeError, OSError) as err:
        raise AudioError(f"{path}: cannot read audio ({err})") from None
    samples = samples.mean(axis=1) if samples.shape[1] > 1 else samples[:, 0]
    if rate != sample_rate:
        samples = resample(samples, rate, sample_rate)
    return samples


def resample(samples: np.ndarray, rate_in: int, rate_out: int) -> np.ndarray:
    import soxr

    return soxr.resample(samples, rate_in, rate_out, quality="HQ").astype(np.float32)
