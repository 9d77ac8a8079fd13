"""Decoding batches: every item exactly once, shortest first, padded audio within budget;
one feature batch equal to each utterance alone."""

import itertools

import numpy as np
import pytest

from asrkit.config import FeatureConfig
from asrkit.decoding.runner import by_budget, featurise_samples
from asrkit.features import GlobalNormalizer, log_mel


def test_groups_cover_every_item_once_within_the_budget():
    rng = np.random.default_rng(0)
    durations = rng.uniform(0.5, 20.0, size=200).tolist()
    items = [f"u{i}" for i in range(200)]
    groups = list(by_budget(items, durations, budget=30.0))
    flat = [item for group in groups for item in group]
    assert sorted(flat) == sorted(items)  # each once
    seconds = {item: d for item, d in zip(items, durations, strict=True)}
    assert [seconds[i] for i in flat] == sorted(durations)  # shortest first
    for group in groups:
        padded = len(group) * max(seconds[i] for i in group)
        assert padded <= 30.0 or len(group) == 1
    # greedy filling: adding the next item would have broken the budget
    for group, following in itertools.pairwise(groups):
        assert (len(group) + 1) * seconds[following[0]] > 30.0


def test_an_item_longer_than_the_budget_forms_its_own_group():
    groups = list(by_budget(["a", "b", "c"], [1.0, 50.0, 2.0], budget=10.0))
    assert groups == [["a", "c"], ["b"]]


@pytest.mark.parametrize("kind", ["asrkit", "nemo"])
def test_a_feature_batch_holds_each_utterance_alone(kind):
    """One compiled call for a padded batch of waveforms of different lengths (one shorter
    than a frame): each row is that waveform's features computed alone, normalised, and
    zero past its own frames."""
    config = FeatureConfig(kind=kind, num_mel_bins=80) if kind == "nemo" else FeatureConfig()
    rng = np.random.default_rng(0)
    audio = [rng.uniform(-0.5, 0.5, n).astype(np.float32) for n in (16_000, 300, 7_777, 12_345)]
    normalizer = GlobalNormalizer(
        rng.normal(size=config.num_mel_bins), np.full(config.num_mel_bins, 2.0)
    )
    batch = featurise_samples(audio, config, normalizer)
    assert batch.audio_seconds == pytest.approx(sum(map(len, audio)) / 16_000)
    assert batch.features.shape[0] == len(audio)
    for row, samples in enumerate(audio):
        alone = np.asarray(normalizer(log_mel(samples, config)))
        n = int(batch.feature_lengths[row])
        assert n == len(alone)
        np.testing.assert_allclose(batch.features[row, :n], alone, rtol=1e-5, atol=1e-5)
        assert not batch.features[row, n:].any()
