"""Shared fixtures. TensorFlow logging is quietened here, in the test process only."""

import os
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import pytest  # noqa: E402

DATA_DIR = Path(__file__).parent / "data"


@pytest.fixture(scope="session")
def golden():
    """The torchaudio / float64 RNN-T reference vectors (see tests/data/golden/README.md)."""
    return np.load(DATA_DIR / "golden" / "rnnt_golden.npz")
