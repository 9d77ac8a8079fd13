"""`asrkit transcribe FILE...`: text, timed words or subtitles from audio files, with an
experiment or a SavedModel; long files are decoded in overlapping windows."""

from __future__ import annotations

import argparse
import sys
import warnings
from pathlib import Path

from asrkit.cli.options import (
    add_chunk_argument,
    add_fusion_arguments,
    add_precision_argument,
    add_search_arguments,
    add_weights_arguments,
    check_before_loading,
    check_search_arguments,
    search_options,
)
from asrkit.errors import InputError

EXTENSIONS = {"text": ".txt", "json": ".jsonl", "srt": ".srt"}


def register(subparsers) -> None:
    transcribe = subparsers.add_parser("transcribe", help="transcribe audio files")
    transcribe.add_argument("files", nargs="*", metavar="FILE")
    transcribe.add_argument(
        "--manifest", help="transcribe a manifest's entries (asrkit's or NeMo's; segments "
                           "by offset) instead of FILEs; each result is named by its id",
    )  # fmt: skip
    source = transcribe.add_mutually_exclusive_group(required=True)
    source.add_argument("--exp-dir", help="a trained experiment")
    source.add_argument("--model", help="a SavedModel from `asrkit export`")
    add_search_arguments(
        transcribe, help="with --exp-dir (an exported model runs the search built into it)"
    )
    add_fusion_arguments(transcribe)
    add_weights_arguments(transcribe)
    add_chunk_argument(transcribe)
    add_precision_argument(transcribe)
    transcribe.add_argument(
        "--format", choices=("text", "json", "srt"), default="text",
        help="text: FILE<TAB>TEXT lines; json: one JSON object per file (text, words with "
             "start/end seconds and confidence); srt: subtitles (one file, or --out-dir)",
    )  # fmt: skip
    transcribe.add_argument("--nbest", type=int, default=0, metavar="N",
                            help="json: also the N best hypotheses (beam search)")  # fmt: skip
    transcribe.add_argument("--out-dir", help="write FILE's result to OUT_DIR/<name>.<format>")
    transcribe.add_argument(
        "--max-seconds", type=float,
        help="longer files are cut at quiet points into segments of at most this (default: "
             "each window with its context within the longest utterance the model was trained "
             "on, as its experiment records it; 30 s when it does not)",
    )  # fmt: skip
    transcribe.add_argument(
        "--context-seconds", type=float,
        help="audio each window also hears on each side (default: a tenth of the longest "
             "training utterance, at most 1 s)",
    )  # fmt: skip
    transcribe.add_argument(
        "--streaming", action="store_true",
        help="decode each file as a stream, --chunk-seconds at a time, printing the text so "
             "far to stderr as it changes (greedy or --method beam; needs an encoder that "
             "streams; --exp-dir)",
    )  # fmt: skip
    transcribe.add_argument("--chunk-seconds", type=float, default=0.32,
                            help="--streaming: audio per step (0.32)")  # fmt: skip
    transcribe.add_argument("--realtime", action="store_true",
                            help="--streaming: feed a file no faster than it plays")  # fmt: skip
    # None: not given (an export has its own; an experiment takes greedy, beam 4, the latest)
    transcribe.set_defaults(func=run, method=None, beam=None, average=None)


def run(args: argparse.Namespace) -> int:
    if args.nbest < 0:
        raise InputError(f"--nbest must be >= 0, got {args.nbest}")
    if args.precision != "float32" and (args.model or args.streaming):
        raise InputError(
            f"--precision {args.precision}: with --exp-dir on whole recordings (an export "
            "and --streaming run the encoder in float32)"
        )
    if args.model:
        _check_export_options(args)
    else:
        args.method = args.method or "greedy"
        args.beam = 4 if args.beam is None else args.beam
        args.average = 1 if args.average is None else args.average
    fusion = check_search_arguments(args)  # the phrase list and LMs read, once
    if args.model and args.nbest > 1:
        _check_export_finds(args.model, args.nbest)
    _check_sources(args)
    recorded = None
    if not args.model:  # before TensorFlow: what the experiment's files can answer
        from asrkit.experiment import load_experiment_config

        recorded = load_experiment_config(args.exp_dir)  # read once, here
        check_before_loading(args, recorded, fusion)
    from asrkit.decoding.long_audio import windowing_for
    from asrkit.decoding.transcribe import transcribe_files

    try:
        windowing, caution = windowing_for(
            _training_max_seconds(args), args.max_seconds, args.context_seconds
        )
    except ValueError as error:
        raise InputError(f"--max-seconds/--context-seconds: {error}") from None
    if caution and not args.streaming:
        warnings.warn(caution, stacklevel=1)
    if args.streaming:
        _check_streaming(args)
    elif args.realtime:
        raise InputError("--realtime simulates a live stream: use it with --streaming")
    from asrkit.audio import AudioError

    recognise = (
        _model_recogniser(args, fusion) if args.model
        else _experiment_recogniser(args, fusion, recorded, windowing)
    )  # fmt: skip
    unreadable = []  # one bad file among several: the others are transcribed, it is named
    if args.streaming:
        found = []
        for path in args.files:
            try:
                found.append(_stream(recognise, path, args))
            except AudioError as err:
                unreadable.append(err)
    else:
        found = transcribe_files(recognise, args.files, unreadable=unreadable)
    return _write(found, unreadable, args)


def _check_sources(args) -> None:
    """FILEs or --manifest (its entries read), and where each result goes, checked before
    anything loads."""
    from asrkit.outputs import writable_directory

    if bool(args.files) == bool(args.manifest):
        raise InputError("give audio FILEs or --manifest M (one of them)")
    if args.manifest:
        from asrkit.data.manifest import read_usable_manifest

        if args.streaming:
            raise InputError("--streaming decodes FILEs: drop --manifest")
        args.files = read_usable_manifest(args.manifest)
    names = [u.id if hasattr(u, "id") else u for u in args.files]
    if args.format == "srt" and len(args.files) > 1 and not args.out_dir:
        raise InputError("--format srt with several files needs --out-dir (one .srt each)")
    stems = [Path(f).stem for f in names]
    if args.out_dir:
        writable_directory(args.out_dir, "--out-dir")
    if args.out_dir and len(set(stems)) < len(stems):
        twice = next(s for s in stems if stems.count(s) > 1)
        raise InputError(f"--out-dir: two files would both write {twice}.*; rename one")
    missing = [f for f in args.files if not args.manifest and not Path(f).is_file()]
    if missing:
        raise InputError(f"no such audio file: {missing[0]}")


def _write(found, unreadable, args) -> int:
    """The transcripts to stdout or --out-dir in the chosen format; the unreadable files
    named on stderr (exit 2; the others are written)."""
    from asrkit.decoding import formats
    from asrkit.outputs import write_files

    render = {
        "text": formats.as_text,
        "json": lambda t: formats.as_json(t, args.nbest),
        "srt": formats.as_srt,
    }[args.format]
    if args.out_dir:
        names = [Path(t.path).stem + EXTENSIONS[args.format] for t in found]
        out = write_files(
            args.out_dir, {n: render(t) + "\n" for n, t in zip(names, found, strict=True)}
        )
        for name in names:
            print(out / name)
    else:
        for transcript in found:
            print(render(transcript))
    if unreadable:
        for err in unreadable:
            print(f"asrkit transcribe: error: {err}", file=sys.stderr)
        print(f"asrkit transcribe: error: {len(unreadable)} of {len(args.files)} file(s) "
              "could not be read (named above); the others were transcribed",
              file=sys.stderr)  # fmt: skip
        return 2
    return 0


def _export_info(model: str) -> dict:
    """An export's asrkit_export.json, read before anything loads ({} if it has none:
    loading it then names the problem)."""
    import json

    try:
        return json.loads((Path(model) / "asrkit_export.json").read_text())
    except (OSError, ValueError):
        return {}


def _training_max_seconds(args) -> float | None:
    """The longest utterance the model was trained on, as its experiment or export records
    it (None: not recorded)."""
    if args.model:
        return _export_info(args.model).get("training_max_seconds")
    from asrkit.experiment import read_training_lengths

    lengths = read_training_lengths(args.exp_dir)
    return lengths.max_seconds if lengths else None


def _check_streaming(args) -> None:
    if args.model:
        raise InputError(
            "--streaming decodes with --exp-dir; a streaming export (asrkit export --streaming) "
            "is served through its stream_step signature"
        )
    if not args.chunk_seconds > 0:
        raise InputError(f"--chunk-seconds must be > 0, got {args.chunk_seconds}")


def _stream(recognise, path: str, args):
    import sys

    from asrkit.decoding.transcribe import stream_file

    def show(seconds: float, text: str) -> None:
        print(f"{path} [{seconds:7.2f} s] {text}", file=sys.stderr, flush=True)

    return stream_file(recognise, path, args.chunk_seconds, args.realtime, show)


def _experiment_recogniser(args, fusion, recorded, windowing):
    from asrkit.decoding.transcribe import NetworkRecogniser
    from asrkit.experiment import load_experiment

    experiment = load_experiment(
        args.exp_dir, args.checkpoint, args.average, chunk_frames=args.chunk_frames,
        config=recorded, precision=args.precision,
    )  # fmt: skip
    config = experiment.config
    options = search_options(args, config)
    boost = fusion.tables(experiment.tokenizer, experiment.network.vocab_size, config.decode,
                          nemo_ids=config.features.lm_tokens_by_id)  # fmt: skip
    return NetworkRecogniser.of(experiment, options, boost, windowing)


def _check_export_options(args) -> None:
    """`--model`: what the export holds decides the search, weights and chunks; an option
    asking for another is refused in one line naming what it holds. Fills args' search
    options from the export (beam 4 if an older export does not say)."""
    info = _export_info(args.model)
    if info.get("streaming"):
        raise InputError(
            f"--model {args.model} is a streaming export (asrkit export --streaming): serve it "
            "through its stream_step signature, or transcribe with a whole-utterance export "
            "(asrkit export without --streaming) or --exp-dir (with --streaming to stream)"
        )
    search = info.get("search") or {}
    method, beam = search.get("method"), search.get("beam")
    held = (
        f"{method} search" + (f", beam {beam}" if method == "beam" else "")
        if method else str(info.get("decoding", "its built-in search")).split(",")[0]
    )  # fmt: skip
    if args.method is not None and method is not None and args.method != method:
        raise InputError(
            f"--method {args.method}: {args.model} runs {held}; export it again with "
            f"--method {args.method} (or use --exp-dir)"
        )
    if args.beam is not None and beam is not None and args.beam != beam:
        raise InputError(
            f"--beam {args.beam}: {args.model} runs {held}; export it again with --method beam "
            f"--beam {args.beam} (or use --exp-dir)"
        )
    for option, given, held_value in (
        ("--max-seconds", args.max_seconds, info.get("window_seconds")),
        ("--context-seconds", args.context_seconds, info.get("window_context_seconds")),
    ):
        if given is not None and (held_value is None or abs(given - held_value) > 1e-9):
            raise InputError(
                f"{option} {given:g}: {args.model} cuts long recordings into segments of up "
                f"to {info.get('window_seconds', '?')} s with "
                f"{info.get('window_context_seconds', '?')} s of context each side; use "
                "--exp-dir to choose other windows"
            )
    weights = info.get("weights", "the weights it was exported with")
    for option, given in (("--checkpoint", args.checkpoint), ("--average", args.average),
                          ("--chunk-frames/--lookahead-frames", args.chunk_frames)):  # fmt: skip
        if given is not None:
            raise InputError(
                f"{option}: {args.model} holds {weights} of {info.get('experiment', '?')} "
                f"(chunk frames: {info.get('chunk_frames')}); export it again with {option}, "
                "or use --exp-dir"
            )
    args.method = method or args.method or "greedy"
    args.beam = beam if beam is not None else (args.beam or 4)
    args.average = 1


def _check_export_finds(model: str, nbest: int) -> None:
    """An export's built-in search must find `nbest` hypotheses."""
    info = _export_info(model)
    found = info.get("hypotheses")
    if found is not None and found < nbest:
        search = str(info.get("decoding", "its search")).split(",")[0]
        raise InputError(
            f"--nbest {nbest}: {model} was exported with {search}, which finds at most "
            f"{found} hypotheses; export with --method beam --beam {nbest}"
        )


def _model_recogniser(args, fusion):
    from asrkit.decoding.transcribe import SavedModelRecogniser

    boost = None
    if args.boost or args.lm:
        from asrkit.config import DecodeConfig
        from asrkit.tokenizer import Tokenizer

        option = "--boost" if args.boost else "--lm"
        if not (Path(args.model) / "tokenizer").is_dir():
            raise InputError(
                f"{option}: {args.model} holds no tokenizer to compile it with; export it "
                "again with this version"
            )
        tokenizer = Tokenizer.load(Path(args.model) / "tokenizer")
        info = _export_info(args.model)
        # the experiment's decode weights as the export records them (defaults if older)
        decode = DecodeConfig(**info.get("fusion_weights", {}))
        boost = fusion.tables(tokenizer, tokenizer.vocab_size, decode,
                              nemo_ids=bool(info.get("nemo_ids")))  # fmt: skip
    return SavedModelRecogniser(args.model, boost)
