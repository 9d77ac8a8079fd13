"""Throughput of an exported SavedModel's serving signatures, side by side: one utterance
per call (`serving_default`) against 16 per call (`serve_batch`), greedy and beam search.

RTF = wall time / audio duration (lower is faster; features, encoder, search and words
included). Each configuration is exported once, warmed up on the same shapes, then timed
over `--repeats` passes of the same utterances.

    python tools/bench_serving.py --exp-dir exp/mini/exp --audio-dir exp/mini/corpus/test-clean
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--exp-dir", required=True)
    parser.add_argument("--audio-dir", required=True, help="audio files (searched recursively)")
    parser.add_argument("--utterances", type=int, default=32)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--average", type=int, default=2)
    args = parser.parse_args(argv)

    import tensorflow as tf

    from asrkit.audio import read_audio
    from asrkit.decoding.search import DecodeOptions
    from asrkit.export import export_model

    files = sorted(p for p in Path(args.audio_dir).rglob("*") if p.suffix in (".flac", ".wav"))[
        : args.utterances
    ]
    audio = [read_audio(p) for p in files]
    seconds = sum(len(a) for a in audio) / 16000
    print(f"{len(audio)} utterances, {seconds:.1f} s of audio; batch {args.batch}; "
          f"{args.repeats} timed passes after a warm-up")  # fmt: skip
    print(f"{'search':<22} {'1 per call (RTF)':>18} {f'{args.batch} per call (RTF)':>20} speed-up")
    for options in (DecodeOptions("greedy"), DecodeOptions("beam", 4, 3)):
        with tempfile.TemporaryDirectory() as tmp:
            out = export_model(args.exp_dir, Path(tmp) / "m", average=args.average,
                               options=options)  # fmt: skip
            loaded = tf.saved_model.load(str(out))
            single, batched = loaded.signatures["serving_default"], loaded.signatures["serve_batch"]
            groups = [audio[i : i + args.batch] for i in range(0, len(audio), args.batch)]
            padded = []
            for group in groups:
                lengths = np.array([len(a) for a in group], np.int32)
                waves = np.zeros((len(group), lengths.max()), np.float32)
                for row, a in enumerate(group):
                    waves[row, : len(a)] = a
                padded.append((tf.constant(waves), tf.constant(lengths)))

            calls = {
                "single": [lambda a=a, f=single: f(waveform=tf.constant(a)) for a in audio],
                "batch": [lambda w=w, n=n, f=batched: f(waveforms=w, lengths=n) for w, n in padded],
            }
            rtf = {}
            for name, run in calls.items():
                for call in run:  # warm-up: traces every shape once
                    call()
                start = time.perf_counter()
                for _ in range(args.repeats):
                    for call in run:
                        call()
                rtf[name] = (time.perf_counter() - start) / args.repeats / seconds
            label = "greedy" if options.method == "greedy" else f"beam {options.beam}"
            print(f"{label:<22} {rtf['single']:>18.4f} {rtf['batch']:>20.4f} "
                  f"{rtf['single'] / rtf['batch']:>7.2f}x")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
