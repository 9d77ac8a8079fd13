"""`asrkit plot --exp-dir EXP`: the training curves of an experiment as a PNG."""

from __future__ import annotations

import argparse
from pathlib import Path


def register(subparsers) -> None:
    plot = subparsers.add_parser("plot", help="draw an experiment's training curves (PNG)")
    plot.add_argument("--exp-dir", required=True)
    plot.add_argument("--out", help="PNG to write (default: <exp-dir>/curves.png)")
    plot.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from asrkit.curves import plot_curves, read_curves

    curves = read_curves(args.exp_dir)
    out = plot_curves(curves, args.out or Path(args.exp_dir) / "curves.png", str(args.exp_dir))
    print(
        f"{len(curves.loss)} training points, {len(curves.dev_wer)} dev points, "
        f"{len(curves.skipped_at)} skipped window(s) -> {out}"
    )
    return 0
