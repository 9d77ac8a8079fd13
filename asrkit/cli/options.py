"""Arguments several subcommands share: which weights to load and which search to run."""

from __future__ import annotations

import argparse


def add_weights_arguments(parser) -> None:
    """--checkpoint DIR or --average N (the last N checkpoints; 1: the latest)."""
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--checkpoint", help="checkpoint directory (default: the latest)")
    group.add_argument("--average", type=int, default=1, metavar="N",
                       help="average the last N checkpoints")  # fmt: skip


def add_search_arguments(parser, help: str | None = None) -> None:
    parser.add_argument("--method", choices=("greedy", "beam"), default="greedy", help=help)
    parser.add_argument("--beam", type=int, default=4, help="beam size (--method beam)")


def search_options(args: argparse.Namespace, max_symbols_per_step: int):
    from asrkit.decoding.search import DecodeOptions
    from asrkit.errors import InputError

    if args.beam < 1:
        raise InputError(f"--beam must be >= 1, got {args.beam}")
    return DecodeOptions(args.method, args.beam, max_symbols_per_step)


def add_chunk_argument(parser) -> None:
    parser.add_argument(
        "--chunk-frames", type=int, metavar="N",
        help="a Conformer trained with dynamic chunks (model.encoder.dynamic_chunks): run "
             "with chunks of N encoder frames (40 ms each; 0: full context) instead of "
             "model.encoder.chunk_frames",
    )  # fmt: skip
