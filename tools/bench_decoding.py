"""Decoding speed: real-time factor of greedy search, beam search and the exported SavedModel.

Decodes a manifest's audio with a trained experiment (weights: the average of the last
`--average` checkpoints) after a warm-up that traces every graph, and prints WER and RTF
(wall time / audio duration, features included) for each method; then exports the model and
times the SavedModel one file at a time, as a server would call it.

    python tools/bench_decoding.py --exp-dir EXP --manifest data/test-clean.jsonl [--average 2]
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--exp-dir", required=True)
    parser.add_argument("--manifest", required=True)
    parser.add_argument("--average", type=int, default=1)
    parser.add_argument("--beams", default="4,8")
    args = parser.parse_args()
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

    import tensorflow as tf

    from asrkit.audio import read_audio
    from asrkit.data.manifest import read_manifest
    from asrkit.decoding.runner import decode_manifest
    from asrkit.decoding.search import DecodeOptions
    from asrkit.experiment import load_experiment
    from asrkit.export import export_model

    experiment = load_experiment(args.exp_dir, average=args.average)
    model, config, tokenizer = experiment.network, experiment.config, experiment.tokenizer
    s = config.decode.max_symbols_per_step
    methods = [("greedy", DecodeOptions("greedy", max_symbols_per_step=s))]
    methods += [(f"beam {b}", DecodeOptions("beam", int(b), s)) for b in args.beams.split(",")]
    print(f"{args.manifest}, weights: average of the last {args.average} checkpoint(s)")
    for name, options in methods:
        decode_manifest(model, args.manifest, tokenizer, config, options)  # warm-up: tracing
        report = decode_manifest(model, args.manifest, tokenizer, config, options)
        print(f"{name:>8}: WER {report.rates.wer * 100:6.2f} %  RTF {report.rtf:.4f}", flush=True)

    with tempfile.TemporaryDirectory() as tmp:
        export_model(args.exp_dir, tmp, average=args.average)
        serve = tf.saved_model.load(tmp).signatures["serving_default"]
        utterances = read_manifest(args.manifest)
        waves = [read_audio(u.audio_path) for u in utterances]
        serve(waveform=tf.constant(waves[0]))  # warm-up
        start = time.perf_counter()
        for wave in waves:
            serve(waveform=tf.constant(wave))
        elapsed = time.perf_counter() - start
        seconds = sum(len(w) for w in waves) / 16_000
        print(f"SavedModel (greedy, one file per call): RTF {elapsed / seconds:.4f}")


if __name__ == "__main__":
    main()
