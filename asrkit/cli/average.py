"""`asrkit average`: average an experiment's last N checkpoints into one."""

from __future__ import annotations

import argparse


def register(subparsers) -> None:
    average = subparsers.add_parser("average", help="average the last N checkpoints into one")
    average.add_argument("--exp-dir", required=True)
    average.add_argument("--last", type=int, required=True, metavar="N")
    average.add_argument("--out", help="default: <exp-dir>/averaged/last<N>-<checkpoint>")
    average.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from pathlib import Path

    from asrkit.outputs import writable_directory, writable_parent

    if args.out:
        writable_parent(args.out, "--out")
    else:
        writable_directory(Path(args.exp_dir) / "averaged", "--exp-dir")
    from asrkit.checkpoints import average_last

    averaged = average_last(args.exp_dir, args.last, args.out)
    names = ", ".join(p.name for p in averaged.sources)
    print(f"averaged {names} (float64) -> {averaged.path}")
    return 0
