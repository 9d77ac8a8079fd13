"""`asrkit` command: a registry of subcommands, each a thin wrapper around a library call."""

from __future__ import annotations

import argparse
import os
import sys

from asrkit import __version__
from asrkit.cli import (
    average,
    corpus,
    decode,
    export,
    features,
    prepare,
    tokenizer,
    train,
    transcribe,
    verify,
)

# Each subcommand module exposes `register(subparsers)`; its parser sets `func`.
SUBCOMMANDS = (
    corpus, prepare, tokenizer, features, train, verify, average, decode, export, transcribe,
)  # fmt: skip


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="asrkit", description="RNN-Transducer speech recognition on TensorFlow / Keras 3"
    )
    parser.add_argument("--version", action="version", version=f"asrkit {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for module in SUBCOMMANDS:
        module.register(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # before TensorFlow is imported
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    return int(args.func(args) or 0)


def train_alias(argv: list[str] | None = None) -> int:
    """`asrkit-train ...` is `asrkit train ...`."""
    argv = sys.argv[1:] if argv is None else argv
    return main(["train", *argv])


if __name__ == "__main__":
    sys.exit(main())
