"""Decoding speed: real-time factor of greedy search, beam search and the exported SavedModel.

Decodes a manifest's audio with one or more trained experiments (weights: the average of
the last `--average` checkpoints) after a warm-up that traces every graph, and prints WER
and RTF (wall time / audio duration, features included) for each method. With several
experiments (e.g. an RNN-T and a TDT model trained alike) the runs alternate, A B A B, for
`--repeats` rounds, and each experiment's RTF is printed as median (min-max) beside the
ratio to the first experiment's. `--serve` also exports each model and times the SavedModel
one file at a time, as a server would call it.

    python tools/bench_decoding.py --exp-dir EXP [EXP2 ...] --manifest data/test-clean.jsonl
        [--average 2] [--beams 4,8] [--repeats 3] [--serve]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import spread


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--exp-dir", required=True, nargs="+")
    parser.add_argument("--manifest", required=True)
    parser.add_argument("--average", type=int, default=1)
    parser.add_argument("--beams", default="4,8")
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--serve", action="store_true", help="time the SavedModel too")
    args = parser.parse_args()
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

    from asrkit.decoding.recogniser import Recogniser
    from asrkit.decoding.runner import decode_manifest
    from asrkit.decoding.search.front import DecodeOptions
    from asrkit.experiment import load_experiment

    experiments = [load_experiment(d, average=args.average) for d in args.exp_dir]
    names = [_name(e) for e in experiments]
    print(f"{args.manifest}, weights: average of the last {args.average} checkpoint(s); "
          f"{args.repeats} alternating round(s)")  # fmt: skip
    print(
        "experiments: " + "; ".join(f"{n} = {d}" for n, d in zip(names, args.exp_dir, strict=True))
    )
    methods = [("greedy", None)] + [(f"beam {b}", int(b)) for b in args.beams.split(",")]
    for method, beam in methods:
        rtfs, wers = [[] for _ in experiments], [None] * len(experiments)
        options, recognisers = [], []
        for e in experiments:
            s = e.config.decode.max_symbols_per_step
            options.append(
                DecodeOptions("beam", beam, s)
                if beam
                else DecodeOptions("greedy", max_symbols_per_step=s)
            )
            recognisers.append(Recogniser.of(e, options[-1]))
            decode_manifest(recognisers[-1], args.manifest, e.tokenizer,
                            e.config.data.batch_seconds)  # trace  # fmt: skip
        for _ in range(args.repeats):
            for i, e in enumerate(experiments):
                report = decode_manifest(
                    recognisers[i], args.manifest, e.tokenizer, e.config.data.batch_seconds
                )
                rtfs[i].append(report.rtf)
                wers[i] = report.rates.wer
        first = spread(rtfs[0]).median
        cells = []
        for name, rtf, wer in zip(names, rtfs, wers, strict=True):
            figure = spread(rtf)
            cells.append(f"{name} WER {wer * 100:5.2f} % RTF {figure.format()} "
                         f"x{figure.median / first:.2f}")  # fmt: skip
        print(f"{method:>8}: " + " | ".join(cells), flush=True)
    if args.serve:
        for name, exp_dir in zip(names, args.exp_dir, strict=True):
            rtf = _serve_rtf(exp_dir, args)
            print(f"SavedModel {name} (greedy, one file per call): RTF {rtf:.4f}")


def _name(experiment) -> str:
    return "TDT" if experiment.network.joint.durations else "RNN-T"


def _serve_rtf(exp_dir, args) -> float:
    import tensorflow as tf

    from asrkit.audio import read_audio
    from asrkit.data.manifest import read_manifest
    from asrkit.export import export_model

    with tempfile.TemporaryDirectory() as tmp:
        export_model(exp_dir, tmp, average=args.average)
        serve = tf.saved_model.load(tmp).signatures["serving_default"]
        waves = [read_audio(u.audio_path) for u in read_manifest(args.manifest)]
        serve(waveform=tf.constant(waves[0]))  # warm-up
        start = time.perf_counter()
        for wave in waves:
            serve(waveform=tf.constant(wave))
        elapsed = time.perf_counter() - start
    return elapsed / (sum(len(w) for w in waves) / 16_000)


if __name__ == "__main__":
    main()
