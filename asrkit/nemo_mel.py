"""NeMo's log-mel front end (AudioToMelSpectrogramPreprocessor) in TensorFlow ops, so that a
model trained with NeMo sees the features it was trained on.

What NeMo computes, step by step (NeMo's `FilterbankFeatures`, inference mode: no dither):
pre-emphasis `x[t] - 0.97 x[t-1]` (the first sample kept, samples past the length zeroed);
`n_fft // 2` zeros on each side (a centred STFT with constant padding); frames of `n_fft`
samples every `hop` samples, each times a symmetric Hann window of `win` samples centred in
`n_fft`; the power spectrum |X|²; a Slaney-normalised mel filterbank (librosa's, or the
checkpoint's own `fb` buffer); log(x + 2⁻²⁴); per-feature normalisation over each
utterance's valid frames (mean, unbiased standard deviation + 1e-5); frames past the valid
length `samples // hop` zeroed; the time axis padded to a multiple of `pad_to`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import tensorflow as tf

from asrkit.errors import InputError

NORMALIZATIONS = ("per_feature", "none")
_STD_FLOOR = 1e-5  # added to each feature's standard deviation, as NeMo does


@dataclass(frozen=True)
class NemoMelSettings:
    """The preprocessor settings of a NeMo model config (`preprocessor:`), in samples."""

    sample_rate: int = 16_000
    win_length: int = 400
    hop_length: int = 160
    n_fft: int = 512
    num_mel_bins: int = 80
    lowfreq: float = 0.0
    highfreq: float | None = None  # None: sample_rate / 2
    preemph: float | None = 0.97
    log_guard: float = 2.0**-24  # log(x + guard)
    normalize: str = "per_feature"  # per_feature | none
    pad_to: int = 0

    def __post_init__(self):
        if not 0 < self.hop_length <= self.win_length <= self.n_fft:
            raise InputError(
                "NeMo features: need 0 < hop <= window <= n_fft, got "
                f"{self.hop_length}, {self.win_length}, {self.n_fft}"
            )
        if self.normalize not in NORMALIZATIONS:
            raise InputError(
                f"NeMo features: normalize must be one of {NORMALIZATIONS}, got {self.normalize!r}"
            )

    def frames(self, samples):
        """Valid feature frames of `samples` samples (NeMo's `get_seq_len`)."""
        return samples // self.hop_length


def slaney_mel_filterbank(settings: NemoMelSettings) -> np.ndarray:
    """[num_mel_bins, n_fft // 2 + 1] float32: librosa's `filters.mel` with its defaults
    (Slaney's mel scale and area normalisation), computed in float64 as librosa does."""
    rate, n_fft, bins = settings.sample_rate, settings.n_fft, settings.num_mel_bins
    high = settings.highfreq if settings.highfreq else rate / 2
    fft_freqs = np.linspace(0, rate / 2, 1 + n_fft // 2)
    mels = np.linspace(_hz_to_mel(settings.lowfreq), _hz_to_mel(high), bins + 2)
    edges = _mel_to_hz(mels)
    widths = np.diff(edges)
    ramps = edges[:, None] - fft_freqs[None, :]
    weights = np.zeros((bins, len(fft_freqs)))
    for i in range(bins):
        lower = -ramps[i] / widths[i]
        upper = ramps[i + 2] / widths[i + 1]
        weights[i] = np.maximum(0, np.minimum(lower, upper))
    weights *= (2.0 / (edges[2 : bins + 2] - edges[:bins]))[:, None]
    return weights.astype(np.float32)


# Slaney's mel scale: linear below 1 kHz (200/3 Hz per mel), logarithmic above.
_F_SP, _MIN_LOG_HZ, _LOG_STEP = 200.0 / 3, 1000.0, np.log(6.4) / 27.0
_MIN_LOG_MEL = _MIN_LOG_HZ / _F_SP


def _hz_to_mel(hz):
    hz = np.asanyarray(hz, np.float64)
    mel = hz / _F_SP
    return np.where(hz >= _MIN_LOG_HZ, _MIN_LOG_MEL + np.log(np.maximum(hz, 1e-10) / _MIN_LOG_HZ)
                    / _LOG_STEP, mel)  # fmt: skip


def _mel_to_hz(mel):
    mel = np.asanyarray(mel, np.float64)
    hz = _F_SP * mel
    return np.where(mel >= _MIN_LOG_MEL, _MIN_LOG_HZ * np.exp(_LOG_STEP * (mel - _MIN_LOG_MEL)), hz)


def symmetric_hann(length: int) -> np.ndarray:
    """torch.hann_window(length, periodic=False): 0.5 - 0.5 cos(2πn / (length - 1))."""
    if length == 1:
        return np.ones(1, np.float32)
    n = np.arange(length, dtype=np.float64)
    return (0.5 - 0.5 * np.cos(2 * np.pi * n / (length - 1))).astype(np.float32)


def framed_log_mel(
    padded, settings: NemoMelSettings, filterbank=None, window=None, dtype=tf.float64
):
    """[..., N] pre-emphasised samples, already padded -> the log-mel of every whole frame
    of `n_fft` samples every `hop` [..., (N - n_fft) // hop + 1, F] float32 (unnormalised),
    computed in `dtype` up to the log."""
    s = settings
    frames = tf.signal.frame(padded, s.n_fft, s.hop_length)  # [..., T, n_fft]
    window = symmetric_hann(s.win_length) if window is None else np.asarray(window, np.float32)
    left = (s.n_fft - s.win_length) // 2
    padded_window = np.zeros(s.n_fft, np.float32)
    padded_window[left : left + s.win_length] = window
    # In float64 up to the log: near-silent bins' log amplifies float32 rounding (1e-4).
    spectrum = tf.signal.rfft(tf.cast(frames, dtype) * tf.constant(padded_window, dtype))
    power = tf.square(tf.math.real(spectrum)) + tf.square(tf.math.imag(spectrum))
    if filterbank is None:
        filterbank = slaney_mel_filterbank(s)
    mel = tf.einsum("...tk,fk->...tf", power, tf.constant(np.asarray(filterbank), dtype))
    return tf.cast(tf.math.log(mel + s.log_guard), tf.float32)


def stream_log_mel(samples, settings: NemoMelSettings, end: bool, dtype=tf.float64):
    """One stream's NeMo features piece by piece (normalize none only). `samples` [N]: the
    raw waveform from one sample before the next frame's first (`hop` x frame - n_fft / 2;
    zeros stand for the samples before the stream's start) -> (the log-mel of the frames
    now whole [m, F], how many samples of `samples` to drop for the next piece). `end`: the
    stream's end: its last frames, padded with zeros as NeMo's centred STFT pads them.
    `dtype`: the spectrum's (float32 for LiteRT, which has no float64 FFT)."""
    s = settings
    x = tf.cast(samples, tf.float32)
    preemph = s.preemph or 0.0
    y = x[1:] - preemph * x[:-1]  # the sample before the stream's start counts as 0
    half = s.n_fft // 2
    # frames before the valid count samples // hop (y holds the samples from the next
    # frame's start: its centre is `half` samples in)
    valid = tf.maximum((tf.shape(y)[0] - half) // s.hop_length, 0)
    if not end:
        whole = tf.maximum((tf.shape(y)[0] - s.n_fft) // s.hop_length + 1, 0)
        count, drop = tf.minimum(whole, valid), None
    else:
        count, drop = valid, tf.shape(x)[0] - 1  # keeps the one sample before: none left
    # zeros after the last sample (NeMo's centred STFT), and at least one frame's worth
    y = tf.pad(y, [[0, s.n_fft]])[: tf.maximum(count - 1, 0) * s.hop_length + s.n_fft]
    frames = framed_log_mel(y, s, dtype=dtype)[:count]
    return frames, count * s.hop_length if drop is None else drop


def nemo_log_mel(
    waveforms, lengths, settings: NemoMelSettings, filterbank=None, window=None
) -> tuple[tf.Tensor, tf.Tensor]:
    """waveforms [B, S] float (zero-padded), lengths [B] -> (features [B, T, F] float32,
    valid frames [B] int32). `filterbank` [F, n_fft/2+1] and `window` [win]: a checkpoint's
    own buffers (default: computed here, as NeMo computes them)."""
    s = settings
    x = tf.cast(waveforms, tf.float32)
    lengths = tf.cast(lengths, tf.int32)
    total = tf.shape(x)[1]
    valid_samples = tf.range(total)[None, :] < lengths[:, None]
    if s.preemph is not None:
        x = tf.concat([x[:, :1], x[:, 1:] - s.preemph * x[:, :-1]], axis=1)
        x = tf.where(valid_samples, x, 0.0)
    pad = s.n_fft // 2
    x = tf.pad(x, [[0, 0], [pad, pad]])
    features = framed_log_mel(x, s, filterbank, window)  # [B, 1 + S // hop, F]
    valid = s.frames(lengths)
    mask = tf.sequence_mask(valid, tf.shape(features)[1])[:, :, None]  # [B, T, 1]
    if s.normalize == "per_feature":
        count = tf.cast(valid, tf.float32)[:, None, None]
        mean = tf.reduce_sum(tf.where(mask, features, 0.0), axis=1, keepdims=True) / count
        centred = tf.where(mask, features - mean, 0.0)
        var = tf.reduce_sum(tf.square(centred), axis=1, keepdims=True) / (count - 1.0)
        std = tf.sqrt(var)
        std = tf.where(tf.math.is_nan(std), 0.0, std) + _STD_FLOOR
        features = (features - mean) / std
    features = tf.where(mask, features, 0.0)
    if s.pad_to > 0:
        extra = (-tf.shape(features)[1]) % s.pad_to
        features = tf.pad(features, [[0, 0], [0, extra], [0, 0]])
    return features, valid
