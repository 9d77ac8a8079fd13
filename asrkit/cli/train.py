"""`asrkit train` / `asrkit-train`: train a transducer from a YAML config."""

from __future__ import annotations

import argparse


def register(subparsers) -> None:
    train = subparsers.add_parser("train", help="train a transducer (resumes automatically)")
    train.add_argument("--config", help="YAML config (unknown keys are errors); default for "
                       "an existing experiment: the config it recorded, so `asrkit train "
                       "--exp-dir EXP` resumes it from any directory")  # fmt: skip
    train.add_argument("--exp-dir", required=True, help="experiment directory")
    train.add_argument("--set", dest="overrides", action="append", default=[],
                       metavar="KEY=VALUE", help="override, e.g. --set train.epochs=5")  # fmt: skip
    train.add_argument("--plan", help="memory plan from `asrkit plan` (sets data.plan)")
    train.add_argument("--init-from", help="checkpoint or experiment dir to fine-tune from")
    train.add_argument("--new-epoch-order", action="store_true",
                       help="resume although shards, buckets, micro-batch sizes or seed changed: "
                       "the current epoch starts again in the new order")  # fmt: skip
    several = train.add_argument_group(
        "several machines", "run the same command on every machine, each with its own "
        "--worker-index; the experiment directory must be shared (docs/multi-worker.md)"
    )  # fmt: skip
    several.add_argument("--workers", metavar="HOST:PORT,...",
                         help="every worker's address, the chief first (sets TF_CONFIG and "
                         "train.strategy=multiworker)")  # fmt: skip
    several.add_argument("--worker-index", type=int, metavar="N",
                         help="this machine's place in --workers (0: the chief)")  # fmt: skip
    several.add_argument("--start-timeout", type=float, default=300.0, metavar="SECONDS",
                         help="how long the workers wait for each other at start "
                         "(default: %(default)s)")  # fmt: skip
    train.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from asrkit.cli.options import experiment_or_config
    from asrkit.outputs import writable_directory

    overrides = [*args.overrides, *([f"data.plan={args.plan}"] if args.plan else [])]
    overrides += _use_workers(args)
    config = experiment_or_config(args.config, args.exp_dir, overrides, new_from_defaults=True)
    writable_directory(args.exp_dir, "--exp-dir")
    from asrkit.training.trainer import train  # TensorFlow: only once the arguments are good

    result = train(config, args.exp_dir, init_from=args.init_from,
                   new_epoch_order=args.new_epoch_order,
                   start_timeout=args.start_timeout)  # fmt: skip
    if result.stopped_by:
        where = result.checkpoint.name if result.checkpoint else "no new checkpoint"
        print(
            f"stopped by {result.stopped_by} after {result.state.updates} updates "
            f"(epoch {result.state.epoch + 1}, {result.state.micro_batches} micro-batches "
            f"in): {where} written; rerun the same command to resume"
        )
        return 0
    wer = "n/a" if result.dev_wer is None else f"{result.dev_wer * 100:.2f} %"
    print(
        f"done: {result.state.updates} updates, {result.state.epoch} epochs, dev WER {wer}, "
        f"{result.seconds:.0f} s -> {args.exp_dir}"
    )
    return 0


def _use_workers(args: argparse.Namespace) -> list[str]:
    """--workers/--worker-index as TF_CONFIG for this process; the override they imply."""
    import os

    from asrkit.training.cluster import ClusterError, parse_workers

    if args.start_timeout <= 0:
        raise ClusterError(f"--start-timeout {args.start_timeout:g}: give seconds > 0")
    if args.workers is None:
        if args.worker_index is not None:
            raise ClusterError("--worker-index needs --workers, the list it indexes")
        return []
    os.environ["TF_CONFIG"] = parse_workers(args.workers, args.worker_index).tf_config()
    return ["train.strategy=multiworker"]
