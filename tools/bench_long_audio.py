"""Long recordings: WER of one long file against the WER of its sentences decoded alone,
and whether any word's time spans a pause.

Builds one recording from the first `--count` utterances of the manifests (in their order),
back to back with pauses of faint noise between them (drawn from `--gaps`, seconds), and
transcribes it as `asrkit transcribe` does (its windowing: the experiment's defaults unless
`--max-seconds` / `--context-seconds` are given); the same utterances are also transcribed
one file each. Prints both WERs and their ratio, the windows, the real-time factor of the
long file (median and range over `--repeats`), and the words whose start and end lie on
two sides of a pause longer than 1 s (a word that spans a pause was glued together from
pieces of two sentences).

    python tools/bench_long_audio.py --exp-dir exp/mini/exp \\
        --manifest exp/mini/data/test-clean.jsonl exp/mini/data/dev-clean.jsonl --count 240
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import timed

RATE = 16_000


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--exp-dir", required=True)
    parser.add_argument("--manifest", required=True, nargs="+")
    parser.add_argument("--count", type=int, default=240, help="utterances joined")
    parser.add_argument("--gaps", default="0.3,0.5,0.8,1.5", help="pause lengths drawn from")
    parser.add_argument("--max-seconds", type=float)
    parser.add_argument("--context-seconds", type=float)
    parser.add_argument("--average", type=int, default=2)
    parser.add_argument("--method", choices=("greedy", "beam"), default="beam")
    parser.add_argument("--repeats", type=int, default=1, help="timed transcriptions")
    args = parser.parse_args(argv)

    import soundfile

    from asrkit.audio import read_audio
    from asrkit.data.manifest import read_manifest
    from asrkit.decoding.long_audio import windowing_for
    from asrkit.decoding.search.front import DecodeOptions
    from asrkit.decoding.transcribe import NetworkRecogniser, transcribe_files
    from asrkit.experiment import load_experiment, read_training_lengths
    from asrkit.metrics import error_rates

    utts = [u for m in args.manifest for u in read_manifest(m)][: args.count]
    gaps = [float(g) for g in args.gaps.split(",")]
    rng = np.random.default_rng(0)
    pieces, pauses, at = [], [], 0.0  # pauses: (start, end) seconds
    for i, u in enumerate(utts):
        audio = read_audio(u.audio_path, RATE)
        pieces.append(audio)
        at += len(audio) / RATE
        if i < len(utts) - 1:
            gap = rng.choice(gaps)
            pieces.append(1e-4 * rng.standard_normal(int(gap * RATE)).astype(np.float32))
            pauses.append((at, at + gap))
            at += gap
    experiment = load_experiment(args.exp_dir, average=args.average)
    lengths = read_training_lengths(args.exp_dir)
    windowing, caution = windowing_for(
        lengths.max_seconds if lengths else None, args.max_seconds, args.context_seconds
    )
    symbols = experiment.config.decode.max_symbols_per_step
    options = DecodeOptions(args.method, 4 if args.method == "beam" else 1, symbols)
    recognise = NetworkRecogniser.of(experiment, options, windowing=windowing)
    refs = [u.text for u in utts]
    with tempfile.TemporaryDirectory() as tmp:
        long_path = Path(tmp) / "long.wav"
        soundfile.write(long_path, np.concatenate(pieces), RATE)
        alone = transcribe_files(recognise, [u.audio_path for u in utts])
        found = []

        def transcribe_long():
            found[:] = transcribe_files(recognise, [long_path])

        wall = timed(transcribe_long, repeats=args.repeats, warmup=0)
    [long] = found
    per_sentence = error_rates(refs, [t.text for t in alone])
    whole = error_rates([" ".join(refs)], [long.text])
    spanning = [
        w for w in long.words for a, b in pauses if b - a > 1.0 and w.start < a and w.end > b
    ]
    print(f"{len(utts)} utterances, {at:.0f} s, pauses of {args.gaps} s; training lengths: "
          + (f"up to {lengths.max_seconds:.1f} s" if lengths else "not recorded"))  # fmt: skip
    if caution:
        print(f"warning: {caution}")
    print(f"windows: segments of <= {windowing.max_seconds:g} s + {windowing.context_seconds:g}"
          f" s context each side; {long.windows} windows; {args.method}")  # fmt: skip
    print(
        f"WER per sentence {100 * per_sentence.wer:.2f} % ({per_sentence.words} words), "
        f"long file {100 * whole.wer:.2f} % (S {whole.substitutions}, D {whole.deletions}, "
        f"I {whole.insertions}), ratio {whole.wer / max(per_sentence.wer, 1e-9):.2f}"
    )
    print(f"long file RTF {(wall.median / at):.4f} ({wall.low / at:.4f}-{wall.high / at:.4f})")
    print(f"words spanning a pause > 1 s: {len(spanning)}"
          + "".join(f"\n  {w.text} {w.start:.2f}-{w.end:.2f} s" for w in spanning[:5]))  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
