"""The exported graph's windows against `long_audio`'s: the same cuts at the same quiet
points and the same windows, for signals with pauses, silence (equally quiet frames) and
none."""

import numpy as np
import pytest
import tensorflow as tf

from asrkit.decoding.long_audio import Windowing
from asrkit.decoding.windows_graph import graph_cut_points, graph_windows
from tests.decoding.window_oracle import cut_points, plan_windows

RATE = 16_000


def _signal(seed: int, seconds: float, kind: str) -> np.ndarray:
    rng = np.random.default_rng(seed)
    n = int(seconds * RATE)
    x = rng.standard_normal(n).astype(np.float32) * 0.1
    if kind == "pauses":  # quiet stretches of random length every few seconds
        at = 0
        while at < n:
            at += int(rng.uniform(1.0, 4.0) * RATE)
            x[at : at + int(rng.uniform(0.1, 0.8) * RATE)] *= 1e-3
    elif kind == "silence":  # exact zeros: every frame there is equally quiet
        x[int(2.5 * RATE) : int(5.5 * RATE)] = 0.0
        x[int(9 * RATE) : int(13 * RATE)] = 0.0
    return x


@pytest.mark.parametrize("kind", ["pauses", "silence", "noise"])
@pytest.mark.parametrize(
    ("max_seconds", "context", "search", "smooth"),
    [(4.0, 0.4, 2.0, 0.2), (6.0, 1.0, 3.0, 0.15), (2.5, 0.0, 1.0, 0.01)],
)
@pytest.mark.parametrize("seconds", [1.0, 17.3])
def test_the_graph_cuts_and_windows_are_long_audios(kind, max_seconds, context, search, smooth,
                                                     seconds):  # fmt: skip
    windowing = Windowing(max_seconds, context, search, smooth)
    samples = _signal(int(seconds * 10) + len(kind), seconds, kind)
    want = cut_points(samples, RATE, windowing)
    compiled = tf.function(lambda s: graph_cut_points(s, RATE, windowing), autograph=False)
    assert compiled(tf.constant(samples)).numpy().tolist() == want
    starts, ends, keep_from, keep_to = graph_windows(tf.constant(samples), RATE, windowing, 640)
    planned = plan_windows(samples, RATE, windowing, 640)
    assert starts.numpy().tolist() == [w.start for w in planned]
    assert ends.numpy().tolist() == [w.end for w in planned]
    np.testing.assert_allclose(keep_from.numpy(), [w.keep_from for w in planned], rtol=1e-6)
    np.testing.assert_allclose(keep_to.numpy(), [w.keep_to for w in planned], rtol=1e-6)
