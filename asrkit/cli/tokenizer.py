"""`asrkit tokenizer train`: a SentencePiece model from the transcripts of manifests."""

from __future__ import annotations

import argparse


def register(subparsers) -> None:
    tok = subparsers.add_parser("tokenizer", help="train a tokenizer")
    actions = tok.add_subparsers(dest="action", metavar="ACTION", required=True)
    train = actions.add_parser("train", help="train SentencePiece on manifest transcripts")
    train.add_argument("--manifest", nargs="+", required=True, help="JSONL manifest(s)")
    train.add_argument("--vocab-size", type=int, required=True)
    train.add_argument("--model-type", default="unigram", choices=["unigram", "bpe", "char"])
    train.add_argument("--out", required=True, help="directory for tokenizer.model/.json")
    train.add_argument(
        "--keep-case", action="store_true",
        help="pieces keep upper and lower case (a cased model: hypotheses as written); by "
             "default text is lower-cased and hypotheses upper-cased. Punctuation is kept "
             "either way, as the transcripts have it",
    )  # fmt: skip
    train.set_defaults(func=run_train)


def run_train(args: argparse.Namespace) -> int:
    from asrkit.outputs import writable_directory

    writable_directory(args.out, "--out")
    from asrkit.data.manifest import iter_manifest
    from asrkit.tokenizer import train_tokenizer

    texts = [u.text for path in args.manifest for u in iter_manifest(path)]
    if not any(t.strip() for t in texts):
        from asrkit.errors import InputError

        names = ", ".join(str(p) for p in args.manifest)
        raise InputError(f"--manifest {names}: no transcript to train on (empty manifest?)")
    tok = train_tokenizer(texts, args.out, args.vocab_size, args.model_type, args.keep_case)
    pieces = f"{tok.vocab_size} pieces ({args.model_type})"
    print(f"tokenizer: {pieces}, blank id {tok.blank_id} -> {args.out}")
    return 0
