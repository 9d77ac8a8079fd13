"""`asrkit corpus synth`: make the built-in synthetic LibriSpeech-layout corpus."""

from __future__ import annotations

import argparse

from asrkit.errors import InputError


def register(subparsers) -> None:
    corpus = subparsers.add_parser("corpus", help="built-in corpora")
    actions = corpus.add_subparsers(dest="action", metavar="ACTION", required=True)
    synth = actions.add_parser("synth", help="synthesise a LibriSpeech-layout corpus with TTS")
    add_synth_arguments(synth)
    synth.set_defaults(func=run_synth)


def add_synth_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", required=True, help="corpus root to create")
    parser.add_argument("--preset", default="mini", choices=["tiny", "mini"])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--noise-db", type=float, default=-60.0, help="noise floor, dBFS")
    parser.add_argument("--language", default="en", choices=["en", "de"],
                        help="the sentences' and voices' language (de: eSpeak NG's German "
                             "voices; transcripts with umlauts and ß)")  # fmt: skip
    parser.add_argument("--natural-share", type=float, default=0.0, metavar="F",
                        help="draw this share of the training speakers from the natural "
                             "voices (flite/festival), not uniformly (0)")  # fmt: skip


def run_synth(args: argparse.Namespace) -> int:
    from asrkit.outputs import writable_directory

    writable_directory(args.out, "--out")
    from asrkit.data.synthetic import make_synthetic_corpus

    if not 0 <= args.natural_share <= 1:
        raise InputError(f"--natural-share must be in [0, 1], got {args.natural_share}")

    report = make_synthetic_corpus(
        args.out,
        args.preset,
        seed=args.seed,
        workers=args.workers,
        noise_db=args.noise_db,
        natural_share=args.natural_share,
        language=args.language,
    )
    for part, count in report.utterances.items():
        voices = ", ".join(report.voices[part])
        print(f"{part}: {count} utterances, {report.hours[part]:.2f} h; voices: {voices}")
    return 0
