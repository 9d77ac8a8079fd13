"""`asrkit transcribe FILE...`: text from audio files, with an experiment or a SavedModel."""

from __future__ import annotations

import argparse

from asrkit.cli.options import add_search_arguments, add_weights_arguments, search_options


def register(subparsers) -> None:
    transcribe = subparsers.add_parser("transcribe", help="transcribe audio files")
    transcribe.add_argument("files", nargs="+", metavar="FILE")
    source = transcribe.add_mutually_exclusive_group(required=True)
    source.add_argument("--exp-dir", help="a trained experiment")
    source.add_argument("--model", help="a SavedModel from `asrkit export`")
    add_search_arguments(
        transcribe, help="with --exp-dir (an exported model runs the search built into it)"
    )
    add_weights_arguments(transcribe, checkpoint=False)
    transcribe.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    lines = _with_model(args) if args.model else _with_experiment(args)
    for path, text in lines:
        print(f"{path}\t{text}")
    return 0


def _with_experiment(args):
    from asrkit.decoding.runner import transcribe_files
    from asrkit.experiment import load_experiment

    experiment = load_experiment(args.exp_dir, average=args.average)
    config = experiment.config
    options = search_options(args, config.decode.max_symbols_per_step)
    found = transcribe_files(experiment.network, args.files, experiment.tokenizer, config, options)
    return [(t.path, t.hypothesis.text) for t in found]


def _with_model(args):
    import json
    from pathlib import Path

    import tensorflow as tf

    from asrkit.audio import read_audio

    rate = json.loads((Path(args.model) / "asrkit_export.json").read_text())["sample_rate"]
    serve = tf.saved_model.load(args.model).signatures["serving_default"]
    out = []
    for path in args.files:
        result = serve(waveform=tf.constant(read_audio(path, rate)))
        out.append((path, result["text"].numpy().decode()))
    return out
