"""`asrkit export`: a SavedModel that turns a waveform into text without asrkit."""

from __future__ import annotations

import argparse
from pathlib import Path

from asrkit.cli.options import (
    add_chunk_argument,
    add_fusion_arguments,
    add_search_arguments,
    add_weights_arguments,
    check_search_arguments,
    search_options,
)


def register(subparsers) -> None:
    export = subparsers.add_parser("export", help="export a waveform -> text SavedModel")
    export.add_argument("--exp-dir", required=True)
    export.add_argument("--out", required=True, help="SavedModel directory")
    export.add_argument("--force", action="store_true",
                        help="replace what --out holds (an earlier export)")  # fmt: skip
    add_weights_arguments(export)
    add_chunk_argument(export)
    add_search_arguments(export, help="the search built into the graph")
    add_fusion_arguments(export)  # built into a streaming export; per request otherwise
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
    from asrkit.decoding.search.strategies import check
    from asrkit.errors import InputError
    from asrkit.experiment import load_experiment_config
    from asrkit.outputs import replacing_directory, writable_parent

    read = check_search_arguments(args)  # the phrase list and LMs read, once
    writable_parent(args.out, "--out")
    if args.litert and not args.streaming:
        raise InputError("--litert converts the streaming step: add --streaming")
    check(args.method, streaming_export=args.streaming)
    fused = [f"--{o}" for o in ("boost", "lm", "lodr") if getattr(args, o)]
    if fused and not args.streaming:
        raise InputError(
            f"{' and '.join(fused)}: a whole-utterance export takes phrases and LMs per "
            "request (serve_boosted; `asrkit transcribe --model EXPORT --boost/--lm`); they "
            "are built into a streaming export (--streaming) only"
        )
    recorded = load_experiment_config(args.exp_dir)  # TF not yet
    options = search_options(args, recorded)
    fusion, described = None, ""
    if fused:
        from asrkit.experiment import TOKENIZER_DIR
        from asrkit.tokenizer import Tokenizer

        tokenizer = Tokenizer.load(Path(args.exp_dir) / TOKENIZER_DIR)
        fusion = read.tables(tokenizer, tokenizer.vocab_size, recorded.decode,
                             nemo_ids=recorded.features.lm_tokens_by_id)  # fmt: skip
        described = _described(read.spec, recorded.decode)
    with replacing_directory(args.out, "--out", args.force) as out:
        from asrkit.decoding.search.front import describe
        from asrkit.export import convert_to_litert, export_model, export_streaming

        if args.streaming:
            export_streaming(args.exp_dir, out, args.checkpoint, args.average, args.chunk_frames,
                             fusion, described)  # fmt: skip
            if args.litert:
                convert_to_litert(out, out / "stream_tokens.tflite")
        else:
            export_model(
                args.exp_dir, out, args.checkpoint, args.average, options, args.chunk_frames
            )
    if args.streaming:
        print(f"streaming SavedModel -> {args.out} (initial_state(), stream_step(samples, "
              "state_*) -> tokens, token_times, text so far, state_*)")  # fmt: skip
        if args.litert:
            print(f"LiteRT -> {Path(args.out) / 'stream_tokens.tflite'}")
    else:
        print(f"SavedModel -> {args.out} (serving_default: one waveform, serve_batch: [N, S] + "
              f"lengths -> text, timed words, n-best; {describe(options)})")  # fmt: skip
    return 0


def _described(spec, decode) -> str:
    """What a streaming export has built in (a FusionSpec at `decode`'s weights), for its
    asrkit_export.json."""
    weights = spec.weights(decode)
    parts = []
    for option, name in (("boost", "boosting"), ("lm", "LM"), ("lodr", "minus LODR")):
        if option in weights:
            parts.append(f"{name} {Path(weights[option]).name} "
                         f"(weight {weights[option + '_weight']:g})")  # fmt: skip
    return ", ".join(parts)
