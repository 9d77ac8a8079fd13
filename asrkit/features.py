"""Log-mel filterbank features in TensorFlow ops, and the only frame-count arithmetic.

`num_frames(num_samples) = 0 if num_samples < frame_length else
1 + (num_samples - frame_length) // frame_step` — the number of whole frames `tf.signal.stft`
returns without end padding (tested against the actual output).

`encoder_frames(frames)` — frames after the encoder's `valid` ×4 convolutional subsampling
(two 3-wide, stride-2, valid convolutions): `n -> (n - 3) // 2 + 1`, twice, floored at 0.
The `striding` and `dw_striding` subsamplings (NeMo's) pad their convolutions:
`n -> (n - 1) // 2 + 1` per halving.

`features.kind: nemo` (NeMo's preprocessor, `asrkit.nemo_mel`): `samples // hop` frames.
"""

from __future__ import annotations

import functools
import json
import os
from pathlib import Path

import numpy as np
import tensorflow as tf

from asrkit.audio import resample
from asrkit.config import FeatureConfig
from asrkit.errors import InputError

DEFAULT_FEATURES = FeatureConfig()


def num_frames(num_samples, config: FeatureConfig = DEFAULT_FEATURES):
    """Feature frames for `num_samples` samples; works on ints, NumPy arrays and tensors."""
    return front_end(config).frames(num_samples)


def conv_frames(frames):
    """Frames after one 3-wide, stride-2, valid convolution: (n - 3) // 2 + 1, floored at 0.

    Works on ints, NumPy arrays and tensors."""
    if isinstance(frames, int | np.integer):
        return max((int(frames) - 3) // 2 + 1, 0)
    maximum = np.maximum if isinstance(frames, np.ndarray) else tf.maximum
    return maximum((frames - 3) // 2 + 1, 0)


def encoder_frames(frames, encoder=None):
    """Encoder frames after the subsampling of `encoder` (an EncoderConfig; default
    asrkit's `valid` ×4: two such convolutions)."""
    if encoder is not None and encoder.subsampling != "valid":
        halvings = encoder.subsampling_factor.bit_length() - 1
        return halved_frames(frames, halvings, encoder.causal_subsampling)
    return conv_frames(conv_frames(frames))


def halved_frames(frames, halvings: int, causal: bool = False):
    """Frames after `halvings` 3-wide, stride-2 convolutions padded by 1 on each side
    (NeMo's subsampling): n -> (n - 1) // 2 + 1 each; `causal` (padded 2 before and 1
    after): n -> n // 2 + 1 each, 0 staying 0. Ints, NumPy arrays and tensors."""
    for _ in range(halvings):
        frames = (frames // 2 + 1) * _sign(frames) if causal else (frames + 2 - 3) // 2 + 1
    return frames


def _sign(frames):
    """1 where frames > 0, else 0, in the type of `frames`."""
    if isinstance(frames, int | np.integer):
        return int(frames > 0)
    if isinstance(frames, np.ndarray):
        return (frames > 0).astype(frames.dtype)
    return tf.cast(frames > 0, frames.dtype)


# The fewest feature frames that make one encoder frame (encoder_frames(7) == 1): shorter
# inputs are zero-padded to it for decoding, their encoder length stays 0.
MIN_FEATURE_FRAMES = 7


def nemo_settings(config: FeatureConfig):
    """The NeMo preprocessor settings of a `features.kind: nemo` config."""
    from asrkit.nemo_mel import NemoMelSettings

    return NemoMelSettings(
        sample_rate=config.sample_rate, win_length=config.frame_length,
        hop_length=config.frame_step, n_fft=config.fft_length,
        num_mel_bins=config.num_mel_bins, lowfreq=config.lower_edge_hz,
        highfreq=config.upper_edge_hz, preemph=config.preemphasis or None,
        log_guard=config.log_floor, normalize=config.normalize, pad_to=0,
    )  # fmt: skip


def log_mel_batch(waveforms, lengths, config: FeatureConfig = DEFAULT_FEATURES):
    """Zero-padded waveforms [B, S] and their lengths [B] -> (features [B, T, F], valid
    frames [B]); frames past each utterance's own are not meaningful (callers mask them)."""
    return front_end(config).batch(waveforms, tf.cast(lengths, tf.int32))


@functools.lru_cache(maxsize=8)
def compiled_log_mel_batch(config: FeatureConfig):
    """`log_mel_batch` for `config` as one graph, traced once for every batch size and length
    (decoding calls it per batch; eager STFT per utterance costs more than the search)."""
    signature = [tf.TensorSpec([None, None], tf.float32), tf.TensorSpec([None], tf.int32)]
    return tf.function(lambda waves, lengths: log_mel_batch(waves, lengths, config),
                       input_signature=signature, autograph=False)  # fmt: skip


def log_mel(samples: tf.Tensor, config: FeatureConfig = DEFAULT_FEATURES) -> tf.Tensor:
    """[..., N] float waveform in [-1, 1] -> [..., num_frames(N), num_mel_bins] float32.
    (`kind: nemo`: one waveform [N]; its per-utterance normalisation needs the whole.)"""
    return front_end(config).one(samples)


class LogMelFrontEnd:
    """asrkit's front end (`features.kind: asrkit`): a framed STFT without padding,
    TensorFlow's mel matrix, log(x + floor)."""

    centred = False  # frame t covers samples [t·step, t·step + length)

    def __init__(self, config: FeatureConfig):
        self.config = config

    def frames(self, num_samples):
        """Feature frames for `num_samples` samples (ints, NumPy arrays and tensors)."""
        config = self.config
        if isinstance(num_samples, int | np.integer):
            if num_samples < config.frame_length:
                return 0
            return 1 + (int(num_samples) - config.frame_length) // config.frame_step
        frames = 1 + (num_samples - config.frame_length) // config.frame_step
        zero = num_samples * 0
        if isinstance(num_samples, np.ndarray):
            return np.where(num_samples < config.frame_length, zero, frames)
        return tf.where(num_samples < config.frame_length, zero, frames)

    def batch(self, waveforms, lengths):
        """Padded waveforms [B, S], lengths [B] -> (features [B, T, F], frames [B])."""
        return self.one(waveforms), self.frames(lengths)

    def one(self, samples) -> tf.Tensor:
        """[..., N] -> [..., frames(N), F]."""
        config = self.config
        samples = tf.cast(samples, tf.float32)
        length = tf.shape(samples)[-1]
        # Shorter than one frame: pad to one frame (stft cannot make zero), then drop it.
        short = tf.maximum(config.frame_length - length, 0)
        paddings = tf.concat([tf.zeros([tf.rank(samples) - 1, 2], tf.int32), [[0, short]]], 0)
        samples = tf.pad(samples, paddings)
        stft = tf.signal.stft(
            samples,
            frame_length=config.frame_length,
            frame_step=config.frame_step,
            fft_length=config.fft_length,
            window_fn=tf.signal.hann_window,
            pad_end=False,
        )
        power = tf.square(tf.abs(stft))
        weights = tf.signal.linear_to_mel_weight_matrix(
            num_mel_bins=config.num_mel_bins,
            num_spectrogram_bins=config.fft_length // 2 + 1,
            sample_rate=config.sample_rate,
            lower_edge_hertz=config.lower_edge_hz,
            upper_edge_hertz=config.upper_edge_hz,
        )
        mel = tf.tensordot(power, weights, axes=1)
        # A gather, not a [..., :n, :] slice: LiteRT has no ellipsis slices (streaming export).
        frames = tf.range(self.frames(length))
        return tf.gather(tf.math.log(mel + config.log_floor), frames, axis=-2)

    # Streaming: a stream's samples arrive in pieces (`asrkit.decoding.streaming`).
    samples_before = 0  # samples a stream starts with (zeros before its start)

    def check_streams(self) -> None:
        """Raises `InputError` when these features cannot be computed piece by piece."""

    def stream(self, samples, dtype=tf.float64):
        """A stream's samples so far -> (the features of the frames now whole [m, F], how
        many samples to drop before the next piece)."""
        made = self.frames(tf.shape(samples)[0])
        return self.one(samples)[:made], made * self.config.frame_step

    def stream_end(self, samples, padded_frame: bool, dtype=tf.float64):
        """The stream's last features, from the samples left at its end (None: none; a
        partial frame is dropped as in a whole utterance)."""
        return None


class NemoFrontEnd:
    """NeMo's preprocessor (`features.kind: nemo`, `asrkit.nemo_mel`): a centred STFT,
    librosa's Slaney mel filterbank, pre-emphasis, optional per-utterance normalisation."""

    centred = True  # frame t is centred at sample t·hop

    def __init__(self, config: FeatureConfig):
        self.config, self.settings = config, nemo_settings(config)
        # NeMo's features: from one sample before the first frame (centred: n_fft / 2
        # samples before the stream's start, zeros)
        self.samples_before = config.fft_length // 2 + 1

    def frames(self, num_samples):
        if isinstance(num_samples, int | np.integer):
            return int(num_samples) // self.config.frame_step
        return num_samples // self.config.frame_step

    def batch(self, waveforms, lengths):
        from asrkit.nemo_mel import nemo_log_mel

        return nemo_log_mel(waveforms, lengths, self.settings)

    def one(self, samples) -> tf.Tensor:
        """One waveform [N] (its per-utterance normalisation needs the whole) -> [T, F]."""
        samples = tf.convert_to_tensor(samples, tf.float32)
        length = tf.shape(samples)[-1]
        features, valid = self.batch(samples[None], length[None])
        return features[0, : valid[0]]

    def check_streams(self) -> None:
        if self.config.normalize != "none":
            raise InputError(
                "streaming needs features without per-utterance normalisation (NeMo's "
                f"normalize: NA); this model's are normalised {self.config.normalize!r} over "
                "each whole utterance"
            )

    def stream(self, samples, dtype=tf.float64):
        from asrkit.nemo_mel import stream_log_mel

        return stream_log_mel(samples, self.settings, False, dtype)

    def stream_end(self, samples, padded_frame: bool, dtype=tf.float64):
        """The last frames, those NeMo's centred STFT pads (`padded_frame`: and the frame
        of zeros past the valid length that NeMo's features tensor holds and its
        cache-aware streaming buffer passes on)."""
        from asrkit.nemo_mel import stream_log_mel

        mel, _ = stream_log_mel(samples, self.settings, True, dtype)
        if padded_frame:
            mel = tf.concat([mel, tf.zeros([1, self.config.num_mel_bins])], axis=0)
        return mel


@functools.lru_cache(maxsize=16)
def front_end(config: FeatureConfig) -> LogMelFrontEnd | NemoFrontEnd:
    """The front end a config names, chosen here once for every caller."""
    return NemoFrontEnd(config) if config.kind == "nemo" else LogMelFrontEnd(config)


def perturb_speed(samples: np.ndarray, factor: float, sample_rate: int = 16_000) -> np.ndarray:
    """Speed perturbation as in Kaldi/sox `speed`: tempo and pitch change together.

    The waveform is treated as if recorded at `factor * sample_rate` and resampled back,
    so `factor=1.1` gives audio about 1/1.1 as long.
    """
    if factor == 1.0:
        return samples
    return resample(samples, round(sample_rate * factor), sample_rate)


class GlobalNormalizer:
    """Per-bin mean/variance normalisation from statistics accumulated over a training set."""

    def __init__(self, mean: np.ndarray, std: np.ndarray):
        self.mean = np.asarray(mean, np.float32)
        self.std = np.asarray(std, np.float32)

    @classmethod
    def fit(cls, feature_batches) -> GlobalNormalizer:
        total = total_sq = None
        count = 0
        for feats in feature_batches:  # each [T, F]
            feats = np.asarray(feats, np.float64)
            s, sq = feats.sum(0), np.square(feats).sum(0)
            total = s if total is None else total + s
            total_sq = sq if total_sq is None else total_sq + sq
            count += feats.shape[0]
        if not count:
            raise ValueError("GlobalNormalizer.fit: no frames")
        mean = total / count
        std = np.sqrt(np.maximum(total_sq / count - np.square(mean), 1e-10))
        return cls(mean, std)

    def __call__(self, features: tf.Tensor) -> tf.Tensor:
        return (features - self.mean) / self.std

    def to_dict(self) -> dict:
        return {"mean": self.mean.tolist(), "std": self.std.tolist()}

    @classmethod
    def from_dict(cls, data: dict) -> GlobalNormalizer:
        return cls(np.array(data["mean"]), np.array(data["std"]))

    def save(self, path: str | os.PathLike) -> None:
        Path(path).write_text(json.dumps(self.to_dict()) + "\n")

    @classmethod
    def load(cls, path: str | os.PathLike) -> GlobalNormalizer:
        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"{path}: CMVN statistics missing (asrkit features cmvn)")
        try:
            return cls.from_dict(json.loads(path.read_text()))
        except (ValueError, KeyError, TypeError) as err:
            raise InputError(f"{path}: not CMVN statistics ({err})") from None

    @property
    def num_mel_bins(self) -> int:
        return int(self.mean.shape[0])


def normalizer_for(cmvn: str | os.PathLike | None) -> GlobalNormalizer | None:
    """The global normaliser a config's `data.cmvn` names (None: features unnormalised)."""
    return GlobalNormalizer.load(cmvn) if cmvn else None
