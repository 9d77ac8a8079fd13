"""`asrkit calibrate`: measure a trained model's emission delay on held-out recordings and
store it in the experiment, so word times (transcribe, export) say when words begin."""

from __future__ import annotations

import argparse
import dataclasses
import time

from asrkit.cli.options import (
    add_search_arguments,
    add_weights_arguments,
    check_search_arguments,
    search_options,
)
from asrkit.errors import InputError


def register(subparsers) -> None:
    calibrate = subparsers.add_parser(
        "calibrate",
        help="measure the model's emission delay (word times) on held-out audio",
        description=(
            "Transcribes recordings of a manifest, measures how long after the speech "
            "onset the model emits the first word (median over utterances), and writes it "
            "to EXP/timing.json; `asrkit transcribe` and `asrkit export` then subtract it "
            "from every token and word time. Use held-out recordings (e.g. dev) that start "
            "with a little silence."
        ),
    )
    calibrate.add_argument("--exp-dir", required=True)
    calibrate.add_argument("--manifest", required=True, help="JSONL manifest of held-out audio")
    calibrate.add_argument("--limit", type=int, default=200, metavar="N",
                           help="use the first N utterances (200)")  # fmt: skip
    add_search_arguments(calibrate)
    add_weights_arguments(calibrate)
    calibrate.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from pathlib import Path

    from asrkit.data.manifest import read_usable_manifest
    from asrkit.experiment import load_experiment_config
    from asrkit.outputs import writable_directory

    if args.limit < 1:
        raise InputError(f"--limit must be >= 1, got {args.limit}")
    utterances = read_usable_manifest(args.manifest)[: args.limit]
    segment = next((u for u in utterances if u.offset is not None), None)
    if segment is not None:
        raise InputError(
            f"{args.manifest}: utterance {segment.id} is a segment (offset {segment.offset} s) "
            "of a longer file; calibrate measures whole files: give it one entry per file"
        )
    check_search_arguments(args)
    recorded = load_experiment_config(args.exp_dir)  # an experiment (before TensorFlow)
    writable_directory(args.exp_dir, "--exp-dir")  # timing.json goes there
    from asrkit.decoding.onset import measure_emission_delay
    from asrkit.decoding.transcribe import NetworkRecogniser
    from asrkit.experiment import load_experiment, write_timing

    experiment = load_experiment(args.exp_dir, args.checkpoint, args.average, config=recorded)
    options = search_options(args, experiment.config)
    # delay 0: measure the frames' own times
    recognise = NetworkRecogniser.of(dataclasses.replace(experiment, emission_delay=0.0), options)
    start = time.perf_counter()
    delay = measure_emission_delay(recognise, [u.audio_path for u in utterances])
    path = write_timing(
        args.exp_dir,
        {
            "emission_delay_seconds": round(delay.seconds, 4),
            "utterances": delay.utterances,
            "skipped": delay.skipped,
            "interquartile_range_seconds": round(delay.spread, 4),
            "manifest": str(Path(args.manifest).resolve()),
            "weights": experiment.weights,
            "search": f"beam {args.beam}" if args.method == "beam" else "greedy",
            "definition": "median over utterances of (first word's start - speech onset), "
            "the start being its emitting frame's centre; asrkit.decoding.onset",
        },
    )
    print(
        f"emission delay {delay.seconds * 1000:.1f} ms (interquartile range "
        f"{delay.spread * 1000:.1f} ms) over {delay.utterances} utterances "
        f"({delay.skipped} without words or a quiet start), {time.perf_counter() - start:.0f} s"
        f" -> {path}"
    )
    return 0
