"""`asrkit export`: a SavedModel that turns a waveform into text without asrkit."""

from __future__ import annotations

import argparse


def register(subparsers) -> None:
    export = subparsers.add_parser("export", help="export a waveform -> text SavedModel")
    export.add_argument("--exp-dir", required=True)
    export.add_argument("--out", required=True, help="SavedModel directory")
    weights = export.add_mutually_exclusive_group()
    weights.add_argument("--checkpoint", help="checkpoint directory (default: the latest)")
    weights.add_argument("--average", type=int, default=1, metavar="N",
                         help="average the last N checkpoints")  # fmt: skip
    export.add_argument("--method", choices=("greedy", "beam"), default="greedy",
                        help="the search built into the graph")  # fmt: skip
    export.add_argument("--beam", type=int, default=4)
    export.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from asrkit.config import load_config
    from asrkit.decoding.search import DecodeOptions, describe
    from asrkit.export import export_model

    symbols = load_config(f"{args.exp_dir}/config.yaml").train.max_symbols_per_step
    options = DecodeOptions(args.method, args.beam, symbols)
    out = export_model(args.exp_dir, args.out, args.checkpoint, args.average, options)
    print(f"SavedModel -> {out} (serving_default: waveform -> text, tokens, score; "
          f"{describe(options)})")  # fmt: skip
    return 0
