"""`asrkit plan`: the search finds the largest micro-batch under the budget, the plan's
accumulation reaches the effective batch, training with a plan stays exact, a plan made for
another model or other shards is refused, and a real measurement keeps its promise."""

import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from asrkit.config import load_config
from asrkit.data.batch_plan import (
    PlanError,
    load_plan,
    micro_batch_plan,
    save_plan,
)
from asrkit.data.order import epoch_order
from asrkit.data.records import shard_counts
from asrkit.sizes import parse_bytes
from asrkit.training.memory_plan import (
    BudgetTooSmall,
    largest_fitting,
    plan_memory,
    predicted_micro_batch,
    probe_buckets,
    summarize,
)
from asrkit.training.verify import verify_accumulation

ROOT = Path(__file__).resolve().parents[2]
CONFIG = """
model:
  encoder: {kind: lstm, lstm_units: 16, lstm_layers: 1, subsampling_filters: 8, dropout: 0.1}
  predictor: {embed_dim: 8, units: 16, dropout: 0.1}
  joint_dim: 16
data:
  train_shards: shards/train
  dev_shards: shards/dev
  tokenizer: tokenizer
  batch_seconds: 6.0
  num_buckets: 3
  label_pad_multiple: 4
train:
  epochs: 1
  effective_batch_seconds: 20.0
  learning_rate: 0.003
  warmup_updates: 2
  checkpoint_every: 0
  probe_memory: false
"""


class FakeMeter:
    """Peak bytes of a step as a known function of the shape (a joint-like term, an
    encoder-like term and a fixed part), so the right answer is computable by brute force."""

    device = "FAKE:0"
    baseline = 10_000

    def __init__(self):
        self.calls = []

    def peak(self, utterances, frames, tokens):
        self.calls.append((utterances, frames, tokens))
        return self.expected(utterances, frames, tokens)

    def expected(self, n, frames, tokens):
        return self.baseline + n * (frames // 4) * (tokens + 1) * 3 + n * frames * 7


@pytest.fixture(scope="module")
def corpus(workdir):
    (workdir / "conf.yaml").write_text(CONFIG)
    return workdir


def config_in(corpus, *overrides):
    """The test config; its paths are relative to the corpus, the tests' working directory."""
    return load_config(corpus / "conf.yaml", list(overrides))


def brute_force(f, usable, limit):
    fitting = [n for n in range(1, limit + 1) if f(n) <= usable]
    return max(fitting, default=0)


@pytest.mark.parametrize("seed", range(6))
def test_search_finds_the_largest_fitting_size_of_a_growing_curve(seed):
    rng = np.random.default_rng(seed)
    fixed, slope, curve = rng.uniform(1e6, 1e8), rng.uniform(1e5, 1e7), rng.uniform(0, 5e3)
    limit = int(rng.integers(1, 400))
    usable = int(rng.uniform(fixed, fixed + slope * limit * 1.3))

    def f(n):  # slightly convex, with steps (allocator rounding)
        return fixed + slope * n + curve * n * n + (n // 7) * 1e4

    size, points = largest_fitting(f, usable, limit)
    assert size == brute_force(f, usable, limit)
    if size < limit:
        assert size + 1 in points  # the next size was measured, not assumed
    assert len(points) <= 8


@pytest.mark.parametrize("seed", range(6))
def test_a_guess_finds_the_same_size_and_a_right_one_costs_two_measurements(seed):
    """The previous bucket's line guesses where to start; whatever the guess, the answer is
    the brute-force largest, and a right guess needs only itself and the next size."""
    rng = np.random.default_rng(seed)
    fixed, slope = rng.uniform(1e6, 1e8), rng.uniform(1e5, 1e7)
    limit = int(rng.integers(3, 400))
    usable = int(rng.uniform(fixed + slope, fixed + slope * limit * 1.3))

    def f(n):
        return fixed + slope * n + (n // 7) * 1e4

    expected = brute_force(f, usable, limit)
    for guess in {2, limit, int(rng.integers(2, limit + 1)), expected, expected + 1}:
        size, points = largest_fitting(f, usable, limit, guess=guess)
        assert size == expected, guess
        if size < limit:
            assert size + 1 in points
    if 1 < expected < limit:
        assert len(largest_fitting(f, usable, limit, guess=expected)[1]) == 2


def test_out_of_memory_counts_as_not_fitting_and_bumps_never_break_the_bracket():
    def oom_beyond_12(n):
        return None if n > 12 else 100 * n

    assert largest_fitting(oom_beyond_12, 10**9, 50)[0] == 12
    bumpy = {n: 100 * n + (250 if n % 5 == 0 else 0) for n in range(1, 60)}
    size, _ = largest_fitting(bumpy.get, 2600, 59)
    assert bumpy[size] <= 2600 < bumpy[size + 1]


def test_plan_per_bucket_is_the_brute_force_largest(corpus, monkeypatch):
    monkeypatch.chdir(corpus)
    config = config_in(corpus)
    _, frames, tokens = shard_counts(config.data.train_shards)
    meter = FakeMeter()
    budget = meter.expected(3, 399, 24)
    plan = plan_memory(config, frames, tokens, meter, budget, margin=0.1, log=lambda *_: None)
    assert plan.usable_bytes == int(budget * 0.9)
    buckets = probe_buckets(config, frames, tokens)
    assert [b.boundary for b in plan.buckets] == [b.boundary for b in buckets]
    sizes = []
    for planned, probe in zip(plan.buckets, buckets, strict=True):

        def f(n, p=probe):
            return meter.expected(n, p.boundary - 1, p.tokens)

        expected = brute_force(f, plan.usable_bytes, probe.utterances)
        assert planned.micro_batch == expected
        assert planned.measured_bytes == f(expected)
        if expected < probe.utterances:
            assert planned.over_bytes == f(expected + 1) > plan.usable_bytes
        # the probe is each bucket's worst shape: its longest padding and most tokens
        members = (frames >= ([0] + [b.boundary for b in buckets])[buckets.index(probe)]) & (
            frames < probe.boundary
        )
        assert probe.tokens == math.ceil(tokens[members].max() / 4) * 4
        sizes.append(expected)
    assert len(set(sizes)) > 1, "the budget was chosen so that the buckets differ"
    # the fitted line reproduces what was measured, so it can predict other budgets
    longest = plan.buckets[-1]
    assert predicted_micro_batch(longest, budget, 0.1) == longest.micro_batch


def test_no_micro_batch_holds_more_than_one_update(corpus, monkeypatch):
    monkeypatch.chdir(corpus)
    config = config_in(corpus, "train.effective_batch_seconds=5.0")
    _, frames, tokens = shard_counts(config.data.train_shards)
    plan = plan_memory(config, frames, tokens, FakeMeter(), 10**12, log=lambda *_: None)
    for bucket in plan.buckets:
        assert bucket.micro_batch == max(1, int(5.0 // ((bucket.boundary - 1) * 0.01)))
        assert bucket.over_bytes is None


def test_a_budget_below_one_utterance_names_the_bucket(corpus, monkeypatch):
    monkeypatch.chdir(corpus)
    config = config_in(corpus)
    _, frames, tokens = shard_counts(config.data.train_shards)
    meter = FakeMeter()
    longest = probe_buckets(config, frames, tokens)[-1]
    budget = meter.expected(1, longest.boundary - 1, longest.tokens) - 1
    with pytest.raises(BudgetTooSmall, match=rf"up to {(longest.boundary - 1) / 100:.1f} s"):
        plan_memory(config, frames, tokens, meter, budget, margin=0.0, log=lambda *_: None)
    with pytest.raises(BudgetTooSmall, match="weights, optimizer state"):
        plan_memory(config, frames, tokens, meter, 5_000, margin=0.0, log=lambda *_: None)


def made_plan(corpus, config, budget_utterances=3):
    _, frames, tokens = shard_counts(config.data.train_shards)
    meter = FakeMeter()
    # About `budget_utterances` of the corpus' longest utterance (its most tokens, padded).
    budget = meter.expected(budget_utterances, int(frames.max()), -(-int(tokens.max()) // 8) * 8)
    plan = plan_memory(config, frames, tokens, meter, budget, margin=0.0, log=lambda *_: None)
    return save_plan(plan, corpus / "plans" / f"plan{budget_utterances}.json"), plan


def test_the_plan_reaches_the_effective_batch_and_counts_the_epoch(corpus, monkeypatch):
    monkeypatch.chdir(corpus)
    config = config_in(corpus)
    path, plan = made_plan(corpus, config)
    assert load_plan(path) == plan  # the file round-trips
    _, frames, _ = shard_counts(config.data.train_shards)
    for replicas in (1, 2):
        summary = summarize(plan, config, frames, replicas)
        boundaries, sizes = plan.sizes(replicas)
        batches = epoch_order(frames, boundaries, sizes, seed=0, epoch=0)
        assert summary.micro_batches_per_epoch == len(batches)
        padded = sum(len(b) * (boundaries[np.searchsorted(boundaries, frames[b].max(),
                                                          side="right")] - 1)
                     for b in batches) * plan.frame_step_seconds  # fmt: skip
        assert summary.micro_batch_seconds == pytest.approx(padded / len(batches))
        steps = summary.accumulation_steps
        assert (
            steps * summary.micro_batch_seconds >= 20.0 > (steps - 1) * summary.micro_batch_seconds
        )
        assert summary.updates_per_epoch == math.ceil(len(batches) / steps)


def test_training_with_a_plan_is_exact_and_uses_its_sizes(corpus, monkeypatch):
    monkeypatch.chdir(corpus)
    path, plan = made_plan(corpus, config_in(corpus), budget_utterances=3)
    config = config_in(corpus, f"data.plan={path}")
    boundaries, sizes = micro_batch_plan(config, *shard_counts(config.data.train_shards)[1:])
    assert (boundaries, sizes) == plan.sizes()
    assert len(set(sizes)) > 1
    report = verify_accumulation(config, steps=3)
    assert report.passed, report
    assert len(set(report.micro_batch_sizes)) > 1  # micro-batches of unequal size


def test_a_plan_for_another_model_or_other_shards_is_refused(corpus, monkeypatch):
    monkeypatch.chdir(corpus)
    path, plan = made_plan(corpus, config_in(corpus))
    _, frames, tokens = shard_counts("shards/train")
    other = config_in(corpus, f"data.plan={path}", "model.joint_dim=32")
    with pytest.raises(PlanError, match=r"model\.joint_dim"):
        micro_batch_plan(other, frames, tokens)
    config = config_in(corpus, f"data.plan={path}")
    with pytest.raises(PlanError, match="shards have one of"):
        micro_batch_plan(config, np.append(frames, plan.buckets[-1].boundary), [*tokens, 1])
    with pytest.raises(PlanError, match=f"with {plan.buckets[0].tokens} tokens"):
        micro_batch_plan(config, frames, tokens + 30)
    (corpus / "plans" / "bad.json").write_text("{}")
    with pytest.raises(PlanError, match="not a plan made by `asrkit plan`"):
        micro_batch_plan(config_in(corpus, "data.plan=plans/bad.json"), frames, tokens)


@pytest.mark.slow  # a whole training run, ~30 s; the plan's use is tested above without one
def test_asrkit_train_with_a_plan_trains_with_its_micro_batches(corpus, monkeypatch, capsys):
    from asrkit.cli.main import main

    monkeypatch.chdir(corpus)
    path, plan = made_plan(corpus, config_in(corpus))
    code = main(["train", "--config", "conf.yaml", "--exp-dir", "exp_plan", "--plan", str(path)])
    assert code == 0
    assert (corpus / "exp_plan" / "plan.json").read_text() == path.read_text()
    state = json.loads(next((corpus / "exp_plan" / "checkpoints").glob("*/state.json")).read_text())
    assert state["data_plan"]["batch_sizes"] == [b.micro_batch for b in plan.buckets]
    sizes = [b.micro_batch for b in plan.buckets]
    assert f"micro-batches of {sizes} utterance(s)" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("text", "value"),
    [("12GiB", 12 * 2**30), ("12G", 12 * 2**30), ("12GB", 12 * 10**9), ("1.5MiB", 1572864),
     ("4096", 4096), ("8000 MB", 8 * 10**9)],
)  # fmt: skip
def test_memory_sizes_parse(text, value):
    assert parse_bytes(text) == value


@pytest.mark.parametrize("text", ["12 apples", "", "-3G", "0"])
def test_bad_memory_sizes_are_refused(text):
    with pytest.raises(ValueError, match="not a memory size"):
        parse_bytes(text)


@pytest.mark.slow  # a real measuring process, ~15 s; the refusal itself is tested in-process above
def test_bad_budget_from_the_command_line_names_the_bucket(corpus):
    """The real measuring process: 2 MiB cannot hold a step of the longest bucket."""
    run = subprocess.run(
        [sys.executable, "-m", "asrkit.cli.main", "plan", "--config", "conf.yaml",
         "--exp-dir", "exp_bad", "--memory", "2MiB", "--margin", "0"],
        cwd=corpus, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert run.returncode == 2, run.stderr
    assert "asrkit plan: error:" in run.stderr and "Traceback" not in run.stderr
    assert "weights, optimizer state" in run.stderr or "the bucket of utterances" in run.stderr
    wrong = subprocess.run(
        [sys.executable, "-m", "asrkit.cli.main", "plan", "--exp-dir", "x", "--memory", "lots"],
        cwd=corpus, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert wrong.returncode == 2 and "not a memory size: 'lots'" in wrong.stderr


@pytest.mark.slow
def test_a_measured_plan_keeps_its_promise(corpus):
    """A budget whose usable part (less the default margin) lies between 3 and 4 utterances of
    the longest bucket, measured on a small Conformer: every bucket's planned micro-batch
    measured <= the usable budget and one utterance more > it; a fresh measuring process, asked
    in another order, finds every planned micro-batch within the budget (the promise) and one
    utterance more beyond the usable part less the allocator's history effect (memory_meter:
    a step's peak moves by up to ~15 % with what ran before it, which the margin covers)."""
    from asrkit.training.memory_meter import MemoryMeter
    from asrkit.training.memory_plan import DEFAULT_MARGIN

    # a large effective batch: memory, not one update's audio, bounds every micro-batch
    conformer = CONFIG.replace(
        "{kind: lstm, lstm_units: 16, lstm_layers: 1, subsampling_filters: 8, dropout: 0.1}",
        "{kind: conformer, d_model: 32, num_blocks: 2, num_heads: 2, subsampling_filters: 8,\n"
        "            dropout: 0.1}",
    )
    assert "kind: conformer" in conformer
    (corpus / "conformer.yaml").write_text(conformer)
    overrides = ["model.predictor.kind=stateless", "train.effective_batch_seconds=3600"]
    config = load_config(corpus / "conformer.yaml", overrides)
    rng = np.random.default_rng(0)
    frames = rng.integers(100, 900, size=300)
    tokens = frames // 12 + rng.integers(0, 8, size=300)
    longest = probe_buckets(config, frames, tokens)[-1]
    shape = (longest.boundary - 1, longest.tokens)
    with MemoryMeter(config, 32) as meter:
        usable = (meter.peak(3, *shape) + meter.peak(4, *shape)) // 2
        budget = int(usable / (1 - DEFAULT_MARGIN))
        plan = plan_memory(config, frames, tokens, meter, budget, log=print)
    sizes = [b.micro_batch for b in plan.buckets]
    assert len(set(sizes)) == len(sizes) and 2 <= sizes[-1] <= 4, sizes
    assert all(b.micro_batch < b.utterances for b in plan.buckets)  # limited by memory
    assert all(b.measured_bytes <= plan.usable_bytes < b.over_bytes for b in plan.buckets)
    with MemoryMeter(config, 32) as fresh:
        for b in reversed(plan.buckets):
            fits = fresh.peak(b.micro_batch, b.boundary - 1, b.tokens)
            over = fresh.peak(b.micro_batch + 1, b.boundary - 1, b.tokens)
            assert fits <= budget, (b, fits)
            assert over > plan.usable_bytes * (1 - DEFAULT_MARGIN), (b, over)
    assert plan.measured_for["model"]["encoder"]["kind"] == "conformer"


def test_a_budget_below_the_training_state_is_refused_before_any_data_is_read(
    corpus, monkeypatch, capsys
):
    """The training shards do not even exist: the refusal comes first, naming the sizes."""
    from asrkit.cli.main import main

    monkeypatch.chdir(corpus)
    code = main(["plan", "--config", "conf.yaml", "--exp-dir", "exp_state", "--memory", "64KiB",
                 "--set", "data.train_shards=no/such/shards"])  # fmt: skip
    err = capsys.readouterr().err
    assert code == 2, err
    assert "the training state alone does not fit: weights" in err and "AdamW slots" in err
    assert "no/such/shards" not in err and not (corpus / "exp_state" / "plan.json").exists()
