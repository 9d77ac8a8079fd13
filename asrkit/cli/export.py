"""`asrkit export`: a SavedModel that turns a waveform into text without asrkit."""

from __future__ import annotations

import argparse

from asrkit.cli.options import add_search_arguments, add_weights_arguments, search_options


def register(subparsers) -> None:
    export = subparsers.add_parser("export", help="export a waveform -> text SavedModel")
    export.add_argument("--exp-dir", required=True)
    export.add_argument("--out", required=True, help="SavedModel directory")
    add_weights_arguments(export)
    add_search_arguments(export, help="the search built into the graph")
    export.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from asrkit.decoding.search import describe
    from asrkit.experiment import load_experiment_config
    from asrkit.export import export_model

    symbols = load_experiment_config(args.exp_dir).decode.max_symbols_per_step
    options = search_options(args, symbols)
    out = export_model(args.exp_dir, args.out, args.checkpoint, args.average, options)
    print(f"SavedModel -> {out} (serving_default: one waveform, serve_batch: [N, S] + lengths "
          f"-> text, timed words, n-best; {describe(options)})")  # fmt: skip
    return 0
