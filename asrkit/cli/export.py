"""`asrkit export`: a SavedModel that turns a waveform into text without asrkit."""

from __future__ import annotations

import argparse

from asrkit.cli.options import (
    add_chunk_argument,
    add_search_arguments,
    add_weights_arguments,
    search_options,
)


def register(subparsers) -> None:
    export = subparsers.add_parser("export", help="export a waveform -> text SavedModel")
    export.add_argument("--exp-dir", required=True)
    export.add_argument("--out", required=True, help="SavedModel directory")
    add_weights_arguments(export)
    add_chunk_argument(export)
    add_search_arguments(export, help="the search built into the graph")
    export.add_argument(
        "--streaming", action="store_true",
        help="a streaming SavedModel instead: initial_state() and stream_step(samples, "
             "state) -> new tokens, text so far, state (greedy; needs a causal encoder)",
    )  # fmt: skip
    export.add_argument(
        "--litert", action="store_true",
        help="--streaming: also OUT/stream_tokens.tflite (LiteRT, built-in ops)",
    )  # fmt: skip
    export.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from asrkit.errors import InputError
    from asrkit.experiment import load_experiment_config
    from asrkit.outputs import writable_parent

    writable_parent(args.out, "--out")
    if args.litert and not args.streaming:
        raise InputError("--litert converts the streaming step: add --streaming")
    if args.streaming and args.method != "greedy":
        raise InputError("--streaming exports greedy search: drop --method beam")
    load_experiment_config(args.exp_dir)  # is it an experiment at all (before TensorFlow)?
    from asrkit.decoding.search import describe
    from asrkit.export import convert_to_litert, export_model, export_streaming

    if args.streaming:
        out = export_streaming(
            args.exp_dir, args.out, args.checkpoint, args.average, args.chunk_frames
        )
        print(f"streaming SavedModel -> {out} (initial_state(), stream_step(samples, state_*) "
              "-> tokens, token_times, text so far, state_*)")  # fmt: skip
        if args.litert:
            print(f"LiteRT -> {convert_to_litert(out, out / 'stream_tokens.tflite')}")
        return 0

    symbols = load_experiment_config(args.exp_dir).decode.max_symbols_per_step
    options = search_options(args, symbols)
    out = export_model(
        args.exp_dir, args.out, args.checkpoint, args.average, options, args.chunk_frames
    )
    print(f"SavedModel -> {out} (serving_default: one waveform, serve_batch: [N, S] + lengths "
          f"-> text, timed words, n-best; {describe(options)})")  # fmt: skip
    return 0
