"""`asrkit prepare librispeech`: scan a LibriSpeech-layout corpus and write JSONL manifests."""

from __future__ import annotations

import argparse
import sys

DEFAULT_PARTS = "train-clean-100,dev-clean,dev-other,test-clean,test-other"


def register(subparsers) -> None:
    prepare = subparsers.add_parser("prepare", help="prepare corpus manifests")
    corpora = prepare.add_subparsers(dest="corpus", metavar="CORPUS", required=True)
    libri = corpora.add_parser("librispeech", help="a LibriSpeech-layout corpus")
    libri.add_argument("--root", required=True, help="directory holding the parts")
    libri.add_argument("--parts", default=DEFAULT_PARTS, help="comma-separated part names")
    libri.add_argument("--out", required=True, help="directory for <part>.jsonl manifests")
    libri.add_argument(
        "--no-resample",
        action="store_true",
        help="reject audio that is not 16 kHz instead of keeping it for resampling",
    )
    libri.add_argument(
        "--any-text", action="store_true",
        help="transcripts in any language, cased and punctuated (Unicode NFC; only control "
             "characters refused): the tokenizer then decides what it can encode. Default: "
             "LibriSpeech's alphabet, A-Z and the apostrophe",
    )  # fmt: skip
    libri.add_argument("--strict", action="store_true", help="exit non-zero on any problem")
    libri.add_argument("--workers", type=int, default=8)
    libri.set_defaults(func=run_librispeech)


def run_librispeech(args: argparse.Namespace) -> int:
    from asrkit.outputs import writable_directory

    writable_directory(args.out, "--out")
    from asrkit.data.librispeech import prepare_librispeech, summarize

    parts = [p for p in args.parts.split(",") if p]
    from asrkit.data.librispeech import ANY_TEXT, DEFAULT_ALPHABET

    alphabet = ANY_TEXT if args.any_text else DEFAULT_ALPHABET
    reports = prepare_librispeech(
        args.root, parts, args.out, resample=not args.no_resample, workers=args.workers,
        alphabet=alphabet,
    )  # fmt: skip
    print(summarize(reports))
    problems = sum(len(r.problems) for r in reports)
    if problems and args.strict:
        print(f"--strict: {problems} problem(s) found", file=sys.stderr)
        return 1
    return 0
