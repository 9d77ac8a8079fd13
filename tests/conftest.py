"""Shared fixtures. TensorFlow logging is quietened here, in the test process only."""

import os
import time
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np
import pytest
import tensorflow as tf

# Two logical CPU devices so MirroredStrategy tests run on any machine. This must happen
# before TensorFlow initialises its runtime, hence here, at collection time.
tf.config.set_logical_device_configuration(
    tf.config.list_physical_devices("CPU")[0],
    [tf.config.LogicalDeviceConfiguration(), tf.config.LogicalDeviceConfiguration()],
)

DATA_DIR = Path(__file__).parent / "data"


@pytest.fixture(scope="session")
def golden():
    """The torchaudio / float64 RNN-T reference vectors (see tests/data/golden/README.md)."""
    return np.load(DATA_DIR / "golden" / "rnnt_golden.npz")


@pytest.fixture(scope="session")
def mirrored():
    """One MirroredStrategy over the two logical CPUs for the whole session: separate
    instances in one process collide on collective instance keys."""
    from asrkit.training.setup import mirrored_strategy

    devices = tuple(d.name for d in tf.config.list_logical_devices("CPU"))
    assert len(devices) == 2, "two logical CPUs are configured above"
    return mirrored_strategy(devices)  # the instance `train(strategy: mirrored)` uses


# A wall-clock deadline (seconds since the epoch) after which tests not yet started are
# skipped, named as such in the summary: CI sets it for the optional slow tier so that the
# run ends inside its time limit on a slower machine, reporting what it did not run.
_DEADLINE = float(os.environ.get("ASRKIT_TEST_DEADLINE") or "inf")


def pytest_runtest_setup(item):
    if time.time() > _DEADLINE:
        pytest.skip("the run's time budget (ASRKIT_TEST_DEADLINE) was spent before this test")
