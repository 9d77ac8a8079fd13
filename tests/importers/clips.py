"""The real clips as asrkit featurises them for an imported model, in one padded batch."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from asrkit.audio import read_audio
from asrkit.features import log_mel

ROOT = Path(__file__).resolve().parents[2]


def clip_features(clips: list[str], features) -> tuple[np.ndarray, np.ndarray]:
    """(features [B, T, F] zero-padded, lengths [B]) of `clips` (paths from the repository's
    root) under a model's `features` config."""
    feats = [log_mel(read_audio(ROOT / clip, 16000), features).numpy() for clip in clips]
    lengths = np.array([len(f) for f in feats], np.int32)
    batch = np.zeros((len(feats), lengths.max(), feats[0].shape[1]), np.float32)
    for i, f in enumerate(feats):
        batch[i, : len(f)] = f
    return batch, lengths
