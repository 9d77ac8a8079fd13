"""Decoding batches: every item exactly once, shortest first, padded audio within budget."""

import itertools

import numpy as np

from asrkit.decoding.runner import by_budget


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
