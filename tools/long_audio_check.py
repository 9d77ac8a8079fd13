"""Long files with a trained model: each utterance repeated K times with a pause between
the copies (`--gap-seconds` of faint noise: the synthetic corpus' utterances start and end
on speech, where a recording has pauses; see recipes/mini/README.md on what a model
trained without pauses does with them), transcribed in windows (cut at quiet points,
joined by time), against the utterance's own words repeated K times.

A window always holds at least one whole copy (windows of 1.3 copies, search over the last
0.6 copy), so any difference comes from the cutting and joining — a word lost or repeated
at a cut, or a word changed by the audio around a cut.

    python tools/long_audio_check.py --exp-dir exp/mini/exp --audio-dir exp/mini/corpus/test-clean
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import numpy as np
import soundfile


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--exp-dir", required=True)
    parser.add_argument("--audio-dir", required=True)
    parser.add_argument("--utterances", type=int, default=20)
    parser.add_argument("--copies", type=int, default=4)
    parser.add_argument("--context-seconds", type=float, default=1.0)
    parser.add_argument("--gap-seconds", type=float, default=0.3)
    parser.add_argument("--average", type=int, default=2)
    args = parser.parse_args(argv)

    from asrkit.audio import read_audio
    from asrkit.decoding.long_audio import Windowing
    from asrkit.decoding.search import DecodeOptions
    from asrkit.decoding.transcribe import NetworkRecogniser, transcribe_files
    from asrkit.experiment import load_experiment

    experiment = load_experiment(args.exp_dir, average=args.average)
    config = experiment.config
    options = DecodeOptions("beam", 4, config.decode.max_symbols_per_step)
    recognise = NetworkRecogniser.of(experiment, options)
    files = sorted(Path(args.audio_dir).rglob("*.flac"))[: args.utterances]
    same = windows = lost = extra = 0
    rng = np.random.default_rng(0)
    with tempfile.TemporaryDirectory() as tmp:
        for path in files:
            gap = 1e-3 * rng.standard_normal(int(args.gap_seconds * 16_000)).astype(np.float32)
            clip = np.concatenate([read_audio(path), gap])
            duration = len(clip) / 16_000
            long_path = Path(tmp) / f"{path.stem}_x{args.copies}.wav"
            soundfile.write(long_path, np.tile(clip, args.copies), 16_000)
            windowing = Windowing(
                max_seconds=1.3 * duration,
                context_seconds=args.context_seconds,
                search_seconds=0.6 * duration,
            )
            one_path = Path(tmp) / f"{path.stem}.wav"
            soundfile.write(one_path, clip, 16_000)
            [one] = transcribe_files(recognise, [one_path], windowing=Windowing())
            [many] = transcribe_files(recognise, [long_path], windowing=windowing)
            want = [w.text for w in one.words] * args.copies
            got = [w.text for w in many.words]
            windows += many.windows
            same += got == want
            lost += max(len(want) - len(got), 0)
            extra += max(len(got) - len(want), 0)
            if got != want:
                print(f"{path.stem}: {' '.join(want)}\n{'':>{len(path.stem)}}  {' '.join(got)}")
    print(
        f"{same}/{len(files)} repeated utterances transcribed as their copies' words "
        f"({args.copies} copies, {windows} windows in all; {lost} words short, {extra} over)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
