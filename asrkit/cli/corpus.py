"""`asrkit corpus synth`: make the built-in synthetic LibriSpeech-layout corpus; `asrkit
corpus text`: sentences of its grammar, text only (e.g. to train an LM)."""

from __future__ import annotations

import argparse

from asrkit.errors import InputError


def register(subparsers) -> None:
    corpus = subparsers.add_parser("corpus", help="built-in corpora")
    actions = corpus.add_subparsers(dest="action", metavar="ACTION", required=True)
    synth = actions.add_parser("synth", help="synthesise a LibriSpeech-layout corpus with TTS")
    add_synth_arguments(synth)
    synth.set_defaults(func=run_synth)
    text = actions.add_parser("text", help="sentences of the synthetic corpus's grammar")
    text.add_argument("--out", required=True, help="the text file to write")
    text.add_argument("--count", type=int, required=True, help="sentences")
    text.add_argument("--seed", type=int, default=0)
    text.add_argument("--language", default="en", choices=["en", "de"])
    text.add_argument(
        "--entities",
        metavar="FILE",
        help="names or terms, one per line, said in --entity-share of them",
    )
    text.add_argument("--entity-share", type=float, default=0.5, metavar="F")
    text.set_defaults(func=run_text)


def add_synth_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", required=True, help="corpus root to create")
    parser.add_argument(
        "--preset", default="mini",
        choices=["tiny", "mini", "open-tiny", "open", "open-voices", "open-seen"],
        help="mini: the built-in grammar, ~1.5 h; open: open-vocabulary English (WordNet's "
             "examples, Debian's wordnet-base), ~6 h, with held-out names and words in dev "
             "and test (TEXT.json, names.txt, lm.txt beside the corpus); open-voices: "
             "~1 h of open's held-out test voices (same --seed) saying other sentences, "
             "tested on open's test sentences (fine-tuning to unheard voices); "
             "open-seen: open's test sentences said by its training voices (what "
             "adapting forgets)",
    )  # fmt: skip
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--noise-db", type=float, default=-60.0, help="noise floor, dBFS")
    parser.add_argument("--language", default="en", choices=["en", "de"],
                        help="the sentences' and voices' language (de: eSpeak NG's German "
                             "voices; transcripts with umlauts and ß)")  # fmt: skip
    parser.add_argument("--natural-share", type=float, default=0.0, metavar="F",
                        help="draw this share of the training speakers from the natural "
                             "voices (flite/festival), not uniformly (0)")  # fmt: skip
    parser.add_argument("--entities", metavar="FILE",
                        help="names or terms, one per line: said in --entity-share of the "
                             "dev and test sentences, never in training")  # fmt: skip
    parser.add_argument(
        "--entity-share",
        type=float,
        default=0.5,
        metavar="F",
        help="share of dev and test sentences with an entity (0.5)",
    )


def run_synth(args: argparse.Namespace) -> int:
    from asrkit.outputs import writable_directory

    writable_directory(args.out, "--out")
    from asrkit.data.synthetic import make_synthetic_corpus

    if not 0 <= args.natural_share <= 1:
        raise InputError(f"--natural-share must be in [0, 1], got {args.natural_share}")
    if not 0 <= args.entity_share <= 1:
        raise InputError(f"--entity-share must be in [0, 1], got {args.entity_share}")
    if args.preset.startswith("open") and (args.entities or args.language != "en"):
        raise InputError(f"--preset {args.preset} speaks English and holds out its own names "
                         "(names.txt): drop --entities and --language")  # fmt: skip
    entities = _read_entities(args.entities) if args.entities else ()

    report = make_synthetic_corpus(
        args.out,
        args.preset,
        seed=args.seed,
        workers=args.workers,
        noise_db=args.noise_db,
        natural_share=args.natural_share,
        language=args.language,
        entities=entities,
        entity_share=args.entity_share,
    )
    for part, count in report.utterances.items():
        voices = ", ".join(report.voices[part])
        print(f"{part}: {count} utterances, {report.hours[part]:.2f} h; voices: {voices}")
    return 0


def run_text(args: argparse.Namespace) -> int:
    from asrkit.data.synthetic import grammar_text
    from asrkit.outputs import writable_file, write_files

    if args.count < 1:
        raise InputError(f"--count must be >= 1, got {args.count}")
    if not 0 <= args.entity_share <= 1:
        raise InputError(f"--entity-share must be in [0, 1], got {args.entity_share}")
    entities = _read_entities(args.entities) if args.entities else ()
    out = writable_file(args.out, "--out")
    entities = tuple(" ".join(e.upper().split()) for e in entities)
    lines = grammar_text(args.count, args.seed, args.language, entities, args.entity_share)
    write_files(out.parent, {out.name: "\n".join(lines) + "\n"})
    print(f"{len(lines)} sentences -> {args.out}")
    return 0


def _read_entities(path: str) -> tuple[str, ...]:
    from pathlib import Path

    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except (FileNotFoundError, UnicodeDecodeError) as err:
        raise InputError(f"--entities {path}: cannot read it ({err})") from None
    entities = tuple(line.strip() for line in lines if line.strip() and not line.startswith("#"))
    if not entities:
        raise InputError(f"--entities {path}: no entity in it (one per line)")
    bad = next((e for e in entities if not all(c.isalpha() or c in " '-" for c in e)), None)
    if bad:
        raise InputError(
            f"--entities {path}: {bad!r} holds characters a transcript cannot (letters, "
            "spaces, apostrophes and hyphens only)"
        )
    return entities
