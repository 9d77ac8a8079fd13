"""Frozen configuration dataclasses: the only place defaults live.

Later issues add the model, training and decoding sections and the strict YAML loader;
each section is a frozen dataclass and overrides go through `dataclasses.replace`.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class FeatureConfig:
    """Log-mel filterbank front end (see `asrkit.features`)."""

    sample_rate: int = 16_000
    num_mel_bins: int = 80
    frame_length: int = 400  # samples (25 ms at 16 kHz)
    frame_step: int = 160  # samples (10 ms at 16 kHz)
    fft_length: int = 512
    lower_edge_hz: float = 20.0
    upper_edge_hz: float = 7_600.0
    log_floor: float = 1e-6

    def __post_init__(self):
        if not 0 < self.frame_step <= self.frame_length <= self.fft_length:
            raise ValueError(
                "FeatureConfig: need 0 < frame_step <= frame_length <= fft_length, got "
                f"{self.frame_step}, {self.frame_length}, {self.fft_length}"
            )
        if not 0 <= self.lower_edge_hz < self.upper_edge_hz <= self.sample_rate / 2:
            raise ValueError("FeatureConfig: need 0 <= lower_edge_hz < upper_edge_hz <= rate/2")


ENCODERS = ("conformer", "lstm")
NORMALIZERS = ("tokens", "utterances")


@dataclass(frozen=True)
class EncoderConfig:
    kind: str = "conformer"  # conformer | lstm
    d_model: int = 144  # conformer width
    num_blocks: int = 16
    num_heads: int = 4
    kernel_size: int = 31
    conv_norm: str = "layer"  # layer | batch (batch breaks exact accumulation, see conformer.py)
    subsampling_filters: int = 144
    lstm_units: int = 320
    lstm_layers: int = 2
    dropout: float = 0.1

    def __post_init__(self):
        if self.kind not in ENCODERS:
            raise ValueError(f"model.encoder.kind must be one of {ENCODERS}, got {self.kind!r}")


@dataclass(frozen=True)
class PredictorConfig:
    embed_dim: int = 128
    units: int = 320
    num_layers: int = 1
    dropout: float = 0.1


@dataclass(frozen=True)
class ModelConfig:
    encoder: EncoderConfig = EncoderConfig()
    predictor: PredictorConfig = PredictorConfig()
    joint_dim: int = 320
    normalize_by: str = "tokens"  # tokens | utterances: what the loss is averaged over

    def __post_init__(self):
        if self.normalize_by not in NORMALIZERS:
            raise ValueError(
                f"model.normalize_by must be one of {NORMALIZERS}, got {self.normalize_by!r}"
            )
