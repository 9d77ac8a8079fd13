"""`asrkit average`: average an experiment's last N checkpoints, or its best N by dev WER,
into one."""

from __future__ import annotations

import argparse


def register(subparsers) -> None:
    average = subparsers.add_parser(
        "average", help="average the last N (or the best N by dev WER) checkpoints into one"
    )
    average.add_argument("--exp-dir", required=True)
    which = average.add_mutually_exclusive_group(required=True)
    which.add_argument("--last", type=int, metavar="N", help="the newest N checkpoints")
    which.add_argument("--best", type=int, metavar="N",
                       help="the N checkpoints with the lowest dev WER (train.keep_best keeps "
                       "them)")  # fmt: skip
    average.add_argument(
        "--out", help="default: <exp-dir>/averaged/last<N>-<checkpoint> (or best<N>-...)"
    )
    average.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from pathlib import Path

    from asrkit.outputs import writable_directory, writable_parent

    if args.out:
        writable_parent(args.out, "--out")
    else:
        writable_directory(Path(args.exp_dir) / "averaged", "--exp-dir")
    from asrkit.checkpoints import average_best, average_last, read_state
    from asrkit.experiment import CONFIG_FILE, adapted_weights, load_experiment_config

    # LoRA merged into each checkpoint's kernels first: the average of the networks
    recorded = (Path(args.exp_dir) / CONFIG_FILE).is_file()
    prepare = adapted_weights(load_experiment_config(args.exp_dir)) if recorded else None
    if args.best is not None:
        averaged = average_best(args.exp_dir, args.best, args.out, prepare)
        wers = [read_state(p).dev_wer for p in averaged.sources]
        names = ", ".join(f"{p.name} ({w * 100:.2f} %)" for p, w in zip(averaged.sources, wers,
                                                                         strict=True))  # fmt: skip
        print(f"averaged the best by dev WER: {names} (float64) -> {averaged.path}")
    else:
        averaged = average_last(args.exp_dir, args.last, args.out, prepare)
        names = ", ".join(p.name for p in averaged.sources)
        print(f"averaged {names} (float64) -> {averaged.path}")
    return 0
