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
