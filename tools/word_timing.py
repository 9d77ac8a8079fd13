"""Word start times of a trained model against eSpeak NG's own word boundaries.

The synthetic corpus is re-planned from its seed (same texts, voices, rates, pitches and
eSpeak seeds as `asrkit corpus synth`); each eSpeak utterance of a part is spoken again
with word events on, which give every word's start as eSpeak placed it. The model
transcribes the corpus' audio files (`asrkit.decoding.transcribe`, as `asrkit transcribe`
does); hypothesis words are matched to reference words where they agree (difflib), and the
start-time error of each matched word is reported: mean absolute, median, bias (mean
signed: a transducer emits a word after it begins), 90th percentile, per voice. With
`--calibrate-part`, the bias measured on that part (other held-out voices, e.g. dev-clean)
is subtracted from the test part's times (an oracle: it needs the reference alignment).
"As emitted" includes the emission delay `asrkit calibrate` stored in the experiment (from
speech onsets, no alignment needed); "frame times" are the emitting frames' own.

    python tools/word_timing.py --exp-dir exp/mini/exp --corpus exp/mini/corpus --seed 0 \\
        --method beam --calibrate-part dev-clean
"""

from __future__ import annotations

import argparse
import difflib
import statistics
import sys
from collections import defaultdict
from pathlib import Path

import numpy as np


def reference_words(corpus: Path, preset: str, seed: int, part: str):
    """[(audio path, voice name, [(start seconds, WORD)])] for the part's eSpeak utterances."""
    from asrkit.data.synthetic import PRESETS, plan_corpus
    from asrkit.data.tts import available_voices, espeak_word_starts

    _, jobs, _ = plan_corpus(corpus, PRESETS[preset], seed, available_voices(), -60.0)
    out = []
    for job in jobs:
        if Path(job.path).relative_to(corpus).parts[0] != part or job.voice.engine != "espeak":
            continue
        _, events = espeak_word_starts(job.voice, job.text.lower(), job.rate, job.pitch, job.seed)
        words = job.text.split()
        if len(events) != len(words) or not Path(job.path).is_file():
            continue  # eSpeak split the text otherwise (rare); no reference
        starts = [(t, w) for (t, _), w in zip(events, words, strict=True)]
        out.append((job.path, job.voice.name, starts))
    return out


def start_errors(recognise, references):
    """{voice: [hypothesis start - reference start, ...]} over matched words, and counts."""
    from asrkit.decoding.transcribe import transcribe_files

    found = transcribe_files(recognise, [path for path, _, _ in references])
    errors, matched, total = defaultdict(list), 0, 0
    for transcript, (_, voice, ref) in zip(found, references, strict=True):
        hyp = transcript.words
        matcher = difflib.SequenceMatcher(
            a=[w for _, w in ref], b=[w.text for w in hyp], autojunk=False
        )
        for block in matcher.get_matching_blocks():
            for k in range(block.size):
                errors[voice].append(hyp[block.b + k].start - ref[block.a + k][0])
        matched += sum(b.size for b in matcher.get_matching_blocks())
        total += len(ref)
    return errors, matched, total


def summary(errors: list[float], shift: float = 0.0) -> str:
    e = np.asarray(errors) - shift
    return (
        f"mean |error| {np.mean(np.abs(e)) * 1000:6.1f} ms, median |error| "
        f"{np.median(np.abs(e)) * 1000:6.1f} ms, bias {np.mean(e) * 1000:+6.1f} ms, "
        f"90th pct |error| {np.percentile(np.abs(e), 90) * 1000:6.1f} ms"
    )


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--exp-dir", required=True)
    parser.add_argument("--corpus", required=True, help="the corpus `asrkit corpus synth` made")
    parser.add_argument("--seed", type=int, default=0, help="the corpus seed")
    parser.add_argument("--preset", default="mini")
    parser.add_argument("--part", default="test-clean")
    parser.add_argument("--calibrate-part", help="measure the bias on this part, remove it")
    parser.add_argument("--method", choices=("greedy", "beam"), default="beam")
    parser.add_argument("--beam", type=int, default=4)
    parser.add_argument("--average", type=int, default=2)
    args = parser.parse_args(argv)

    from asrkit.decoding.search import DecodeOptions
    from asrkit.decoding.transcribe import NetworkRecogniser
    from asrkit.experiment import load_experiment

    experiment = load_experiment(args.exp_dir, average=args.average)
    config = experiment.config
    options = DecodeOptions(args.method, args.beam, config.decode.max_symbols_per_step)
    recognise = NetworkRecogniser.of(experiment, options)
    corpus = Path(args.corpus).resolve()
    shift = 0.0
    if args.calibrate_part:
        refs = reference_words(corpus, args.preset, args.seed, args.calibrate_part)
        errors, matched, total = start_errors(recognise, refs)
        pooled = [e for voice in errors.values() for e in voice]
        shift = statistics.fmean(pooled)
        print(f"{args.calibrate_part}: {matched}/{total} words matched; {summary(pooled)}")
        print(f"  -> calibration: subtract {shift * 1000:+.1f} ms")
    refs = reference_words(corpus, args.preset, args.seed, args.part)
    if not refs:
        print(f"no eSpeak utterances in {corpus}/{args.part}", file=sys.stderr)
        return 2
    errors, matched, total = start_errors(recognise, refs)
    pooled = [e for voice in errors.values() for e in voice]
    print(f"{args.part}: {len(refs)} eSpeak utterances, {matched}/{total} words matched")
    delay = experiment.emission_delay
    print(
        f"  as emitted:     {summary(pooled)}  (emission delay {delay * 1000:.1f} ms"
        f"{' from asrkit calibrate' if delay else ': not calibrated'})"
    )
    if delay:
        print(f"  frame times:    {summary(pooled, -delay)}  (without the delay)")
    if args.calibrate_part:
        print(f"  calibrated:     {summary(pooled, shift)}")
    for voice, values in sorted(errors.items()):
        print(f"  {voice:<24} {len(values):4d} words: {summary(values, shift)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
