"""`asrkit lm train`: an n-gram LM over a model's pieces, for `--lm` and `--lodr`."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import NamedTuple

from asrkit.errors import InputError


def register(subparsers) -> None:
    lm = subparsers.add_parser("lm", help="n-gram language models for LM fusion")
    actions = lm.add_subparsers(dest="action", metavar="ACTION", required=True)
    train = actions.add_parser(
        "train", help="an interpolated Kneser-Ney n-gram LM over a model's pieces (ARPA)"
    )
    train.add_argument(
        "--tokenizer", required=True, metavar="DIR",
        help="the model's tokenizer: an experiment or export directory, or a tokenizer's own",
    )  # fmt: skip
    source = train.add_mutually_exclusive_group(required=True)
    source.add_argument("--text", nargs="+", metavar="FILE",
                        help="plain text, one sentence per line")  # fmt: skip
    source.add_argument("--manifest", nargs="+", metavar="FILE",
                        help="manifests (asrkit's or NeMo's): their transcripts")  # fmt: skip
    train.add_argument(
        "--order",
        type=int,
        default=3,
        help="n-gram order (3; pieces of a letter or two want 5 or more)",
    )
    train.add_argument(
        "--allow-unknown", action="store_true",
        help="train on text holding characters the tokenizer cannot encode (they become "
             "<unk> pieces in the LM), with a warning, instead of refusing it",
    )  # fmt: skip
    train.add_argument("--out", required=True, help="the ARPA file to write (.arpa)")
    train.set_defaults(func=run_train)


def run_train(args: argparse.Namespace) -> int:
    from asrkit.outputs import writable_file

    if not 1 <= args.order <= 10:
        raise InputError(f"--order must be 1 to 10, got {args.order}")
    writable_file(args.out, "--out")
    tokenizer = _tokenizer(Path(args.tokenizer))
    sentences = _sentences(args)
    _check_alphabet(sentences, tokenizer, args)
    sentences = [s.text for s in sentences]
    from asrkit.ngram import estimate, write_arpa
    from asrkit.tokenizer import BLANK_ID

    pieces = [tokenizer.piece(i) for i in range(tokenizer.vocab_size) if i != BLANK_ID]
    encoded = [[tokenizer.piece(i) for i in tokenizer.encode(s)] for s in sentences]
    lm = estimate(encoded, args.order, pieces)
    write_arpa(lm, args.out)
    counts = ", ".join(
        f"{n}-grams {sum(1 for g in lm.probs if len(g) == n)}" for n in range(1, lm.order + 1)
    )
    tokens = sum(len(e) for e in encoded)
    print(f"LM: order {lm.order}, {len(sentences)} sentences, {tokens} pieces; {counts} "
          f"-> {args.out}")  # fmt: skip
    from asrkit.decoding.fusion.lm import lm_contexts
    from asrkit.decoding.fusion.tables import MAX_TABLE_ENTRIES

    contexts = len(lm_contexts(lm))
    if contexts * tokenizer.vocab_size > MAX_TABLE_ENTRIES:
        import warnings

        warnings.warn(
            f"{args.out}: {contexts} contexts x {tokenizer.vocab_size} pieces exceed the "
            f"{MAX_TABLE_ENTRIES:,} table entries a search takes: `--lm` will refuse it; "
            "train with a lower --order or on less text",
            stacklevel=1,
        )
    return 0


def _tokenizer(directory: Path):
    from asrkit.tokenizer import Tokenizer

    for candidate in (directory, directory / "tokenizer"):
        if (candidate / "tokenizer.json").is_file():
            return Tokenizer.load(candidate)
    raise InputError(
        f"--tokenizer {directory}: no tokenizer there (tokenizer.json); give an experiment "
        "directory, an export, or a tokenizer's directory"
    )


class _Sentence(NamedTuple):
    id: str  # the file and line, or the manifest's utterance id
    text: str


def _check_alphabet(sentences: list[_Sentence], tokenizer, args: argparse.Namespace) -> None:
    """Text the tokenizer maps to <unk> is refused (as `features extract` refuses it), or
    with --allow-unknown trained on with one warning."""
    from asrkit.data.records import unknown_characters

    option = "--text" if args.text else "--manifest"
    what = unknown_characters(sentences, tokenizer, option, "line" if args.text else "utterance")
    if what is None:
        return
    if args.allow_unknown:
        import warnings

        warnings.warn(f"{what}: the LM learns <unk> where they stand", stacklevel=2)
        return
    raise InputError(
        f"{what}: an LM over this tokenizer's pieces would learn <unk> there; normalise "
        "the text to the model's alphabet, or pass --allow-unknown"
    )


def _sentences(args: argparse.Namespace) -> list[_Sentence]:
    sentences = []
    if args.text:
        for path in map(Path, args.text):
            if not path.is_file():
                raise InputError(f"--text {path}: no such file")
            try:
                lines = path.read_text(encoding="utf-8").splitlines()
            except UnicodeDecodeError as err:
                raise InputError(f"--text {path}: not UTF-8 text ({err.reason})") from None
            sentences += [_Sentence(f"{path.name}:{number}", line.strip())
                          for number, line in enumerate(lines, 1) if line.strip()]  # fmt: skip
    else:
        from asrkit.data.manifest import iter_manifest

        for path in map(Path, args.manifest):  # transcripts only: the audio need not be here
            if not path.is_file():
                raise InputError(f"--manifest {path}: no such manifest")
            sentences += [_Sentence(u.id, u.text) for u in iter_manifest(path) if u.text.strip()]
    if not sentences:
        option = "--text" if args.text else "--manifest"
        raise InputError(f"{option}: no sentence to train on (empty files?)")
    return sentences
