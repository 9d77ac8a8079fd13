"""Audio in the shards: records that hold an utterance's audio (FLAC, 16-bit) instead of its
log-mel frames, whose features the input pipeline computes as it reads them.

A training epoch draws each utterance's speed factor from the shards' recorded choices
(`asrkit features extract --store audio --speeds 0.9,1.0,1.1`) as a function of (seed,
epoch, record), so the epoch's lengths, its order and its micro-batches are known before a
record is read, and a resumed run reads the same features. Decoding and statistics read
them at speed 1. A record's features at speed s are what the feature shards would hold
for that utterance at speed s: the same resampling and the same log-mel (bit for bit when
computed eagerly, as extraction does, for audio read from 16-bit files; inside tf.data's
graph the STFT rounds differently, by up to 2e-4 on log-mel values of about 10; the faint
noise of a joined utterance's pauses is stored at 16 bits).
"""

from __future__ import annotations

import io
from dataclasses import dataclass

import numpy as np
import tensorflow as tf

from asrkit.config import FeatureConfig
from asrkit.features import log_mel, num_frames, perturb_speed

STORES = ("features", "audio")  # what a shard record holds: log-mel frames, or the audio


@dataclass(frozen=True)
class OnTheFly:
    """How the records of an audio shard set become features."""

    features: FeatureConfig
    speeds: tuple[float, ...] = (1.0,)  # a training epoch draws one per utterance


def encode_flac(samples: np.ndarray, sample_rate: int) -> bytes:
    """float samples in [-1, 1] -> FLAC bytes, 16-bit (audio read from 16-bit files comes
    back sample for sample)."""
    buffer = io.BytesIO()
    clipped = np.clip(np.asarray(samples, np.float32), -1.0, 32767 / 32768)
    import soundfile

    soundfile.write(buffer, clipped, sample_rate, format="FLAC", subtype="PCM_16")
    return buffer.getvalue()


def decode_flac(data: bytes) -> np.ndarray:
    import soundfile

    samples, _ = soundfile.read(io.BytesIO(data), dtype="float32")
    return samples


def speed_samples(samples, speed, sample_rate: int = 16_000):
    """The length of `samples` samples after `perturb_speed` by `speed` (elementwise)."""
    samples = np.asarray(samples, np.int64)
    speed = np.broadcast_to(np.asarray(speed, np.float64), samples.shape)
    rate_in = np.round(sample_rate * speed).astype(np.int64)  # as perturb_speed resamples
    out = (2 * samples * sample_rate + rate_in) // (2 * rate_in)  # soxr: n·out/in, half up
    return np.where(speed == 1.0, samples, out)


def epoch_speeds(count: int, speeds: tuple[float, ...], key: int) -> np.ndarray:
    """One speed factor per record for the epoch whose order seed is `key`."""
    choices = np.asarray(speeds, np.float64)
    if len(choices) == 1:
        return np.full(count, choices[0])
    return choices[np.random.default_rng([key, 0x5EED]).integers(len(choices), size=count)]


def epoch_frames(samples: np.ndarray, speeds: np.ndarray, features: FeatureConfig):
    """Each record's feature frames at its epoch's speed."""
    return np.asarray(
        num_frames(speed_samples(samples, speeds, features.sample_rate), features), np.int64
    )


def _frames_at_each_speed(samples: np.ndarray, audio: OnTheFly) -> np.ndarray:
    """[speeds, N]: each record's frames at each of the recorded speeds."""
    return np.stack([epoch_frames(samples, np.full(len(samples), s), audio.features)
                     for s in audio.speeds])  # fmt: skip


def slowest_frames(samples: np.ndarray, audio: OnTheFly) -> np.ndarray:
    """Each record's frames at the slowest speed (its longest version): what plans buckets
    and memory for every epoch."""
    return _frames_at_each_speed(samples, audio).max(axis=0)


def fastest_frames(samples: np.ndarray, audio: OnTheFly) -> np.ndarray:
    """Each record's frames at the fastest speed (its shortest version): a record is usable
    when even that one has enough encoder frames for its tokens."""
    return _frames_at_each_speed(samples, audio).min(axis=0)


def audio_features(audio: tf.Tensor, speed: tf.Tensor, features: FeatureConfig) -> tf.Tensor:
    """A record's FLAC bytes (string scalar) at `speed` -> [T, F] log-mel."""

    def decode(data, factor):  # data: a 0-d object array holding the bytes
        data = data.item() if isinstance(data, np.ndarray) else data
        return perturb_speed(decode_flac(data), float(factor), features.sample_rate)

    samples = tf.numpy_function(decode, [audio, speed], tf.float32, stateful=False)
    samples = tf.ensure_shape(samples, [None])
    return tf.ensure_shape(log_mel(samples, features), [None, features.num_mel_bins])
