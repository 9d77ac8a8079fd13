"""`asrkit verify-accumulation`: N micro-batches vs their union, on your model and data."""

from __future__ import annotations

import argparse
from pathlib import Path


def register(subparsers) -> None:
    verify = subparsers.add_parser(
        "verify-accumulation", help="check that N accumulated micro-batches == their union"
    )
    verify.add_argument("--config", help="YAML config (as for asrkit train)")
    verify.add_argument("--exp-dir", required=True, help="where the report is written")
    verify.add_argument("--steps", type=int, default=4, help="micro-batches per update (N)")
    verify.add_argument("--tolerance", type=float,
                        help="max relative weight difference (default: 1e-4 in float32; in "
                             "reduced precision a fixed one, or with --floor the larger of it "
                             "and twice the union's measured distance from float32)")  # fmt: skip
    verify.add_argument("--floor", action="store_true",
                        help="in reduced precision, also measure how far the union's update "
                             "is from float32's, allow twice that (~1.4x the memory)")  # fmt: skip
    verify.add_argument("--set", dest="overrides", action="append", default=[],
                        metavar="KEY=VALUE")  # fmt: skip
    verify.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from asrkit.config import load_config
    from asrkit.training.verify import verify_accumulation

    config = load_config(args.config, args.overrides)
    report = verify_accumulation(config, args.steps, args.tolerance, args.floor)
    verdict = "PASS" if report.passed else "FAIL"
    line = (
        f"{verdict}: {report.steps} micro-batches (sizes {report.micro_batch_sizes}) vs their "
        f"union, precision {config.train.precision}: max relative weight difference "
        f"{report.max_relative_difference:.2e} (tolerance {report.tolerance:g}), relative "
        f"norm of the difference {report.norm_relative_difference:.2e}"
    )
    if report.floor_max is not None:
        line += (
            f"; the precision's own floor (the union's update against float32's) "
            f"{report.floor_max:.2e} max, {report.floor_norm:.2e} norm"
        )
    print(line)
    out = Path(args.exp_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "verify_accumulation.txt").write_text(line + "\n")
    return 0 if report.passed else 1
