"""`asrkit plan`: measure, per length bucket, the largest micro-batch that fits a memory
budget, and write the plan `asrkit train --plan` trains with."""

from __future__ import annotations

import argparse
from pathlib import Path


def _memory(text: str) -> int:
    from asrkit.sizes import parse_bytes

    try:
        return parse_bytes(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


def _fraction(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0 <= value < 1:
        raise argparse.ArgumentTypeError(f"must be a fraction in [0, 1), got {text!r}")
    return value


def register(subparsers) -> None:
    plan = subparsers.add_parser(
        "plan", help="measure the largest micro-batch per length bucket for a memory budget"
    )
    plan.add_argument(
        "--config", help="YAML config (as for asrkit train); default for an existing "
        "experiment (an imported model too): the config it recorded",
    )  # fmt: skip
    plan.add_argument("--exp-dir", required=True, help="the plan is written to <exp-dir>/plan.json")
    plan.add_argument("--memory", type=_memory, metavar="SIZE",
                      help="device memory budget, e.g. 12GiB (default: the device's)")  # fmt: skip
    plan.add_argument("--device", help="where to measure, e.g. GPU:0 or CPU:0 (default: GPU:0 "
                      "if there is one)")  # fmt: skip
    plan.add_argument("--margin", type=_fraction,
                      help="fraction of the budget kept free (default 0.15: a step's peak "
                      "depends on the shapes run before it by up to ~15 %%)")  # fmt: skip
    plan.add_argument("--no-emulate", action="store_true",
                      help="GPU: measure with the whole card instead of a logical device "
                      "limited to --memory")  # fmt: skip
    plan.add_argument("--set", dest="overrides", action="append", default=[],
                      metavar="KEY=VALUE")  # fmt: skip
    plan.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from asrkit.cli.options import experiment_or_config
    from asrkit.outputs import writable_directory

    config = experiment_or_config(args.config, args.exp_dir, args.overrides)
    writable_directory(args.exp_dir, "--exp-dir")
    from asrkit.data.batch_plan import save_plan
    from asrkit.experiment import PLAN_FILE
    from asrkit.sizes import format_bytes
    from asrkit.training.memory_plan import DEFAULT_MARGIN, plan_training

    margin = DEFAULT_MARGIN if args.margin is None else args.margin
    try:  # the training state is checked against the budget first, then the data
        plan, summary = plan_training(config, args.memory, args.device, margin, not args.no_emulate)
    except FileNotFoundError:
        _check_training_data(config, Path(args.exp_dir))  # names what is missing
        raise
    path = save_plan(plan, Path(args.exp_dir) / PLAN_FILE)
    step = plan.frame_step_seconds
    print(f"\nplan for {plan.device}, {format_bytes(plan.usable_bytes)} usable "
          f"({format_bytes(plan.budget_bytes)} less {plan.margin:.0%}):")  # fmt: skip
    print("  bucket (s)  utterances  tokens  micro-batch  seconds   peak        +1 utterance")
    for b in plan.buckets:
        over = {None: "at its limit", -1: "out of memory"}.get(b.over_bytes)
        print(
            f"  <= {(b.boundary - 1) * step:6.1f}  {b.utterances:10d}  {b.tokens:6d}  "
            f"{b.micro_batch:11d}  {b.micro_batch * (b.boundary - 1) * step:7.1f}   "
            f"{format_bytes(b.measured_bytes):10s}  {over or format_bytes(b.over_bytes)}"
        )
    target = config.train.effective_batch_seconds
    print(
        f"micro-batches: {summary.micro_batch_seconds:.1f} s audio on average, "
        f"{summary.micro_batches_per_epoch} per epoch; {summary.accumulation_steps} per update "
        f"= effective batch {summary.effective_batch_seconds:.0f} s"
        + (f" (train.effective_batch_seconds {target:.0f})" if target else
           " (train.accumulation_steps; set train.effective_batch_seconds to derive it)")
        + f"; {summary.updates_per_epoch} updates per epoch (one device)"
    )  # fmt: skip
    print(f"wrote {path}; train with: asrkit train ... --plan {path}")
    return 0


def _check_training_data(config, exp_dir: Path) -> None:
    """The plan measures the training data's lengths: without shards, say so (an imported
    model comes without any) and how to give them."""
    from asrkit.errors import InputError
    from asrkit.experiment import CONFIG_FILE

    shards = Path(config.data.train_shards)
    if (shards / "shards.json").is_file():
        return
    recorded = exp_dir / CONFIG_FILE
    imported = recorded.is_file() and recorded.read_text().startswith("# Imported from")
    what = "an imported model comes without training data" if imported else "no shards there"
    raise InputError(
        f"data.train_shards {shards}: {what}; the plan measures your training data: "
        f"extract its features (`asrkit features extract --config {recorded} ...`) and add "
        "--set data.train_shards=DIR"
    )
