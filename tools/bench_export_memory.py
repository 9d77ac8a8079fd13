"""Peak memory of an exported SavedModel decoding one long waveform, by length.

For each length in `--minutes`, a fresh child process (plain TensorFlow: `tf.saved_model.
load`, no asrkit) calls `serving_default` once on a waveform of that many minutes — the
`--audio` clip repeated with a short pause between copies — and reports its peak resident
memory (ru_maxrss), that peak less the waveform's own two copies (the NumPy array and the
input tensor: 8 bytes per sample), and the wall time. A full-context model decoded whole
needs memory growing with the square of the length; windowed, the rest stays flat after the
first window.

    python tools/bench_export_memory.py --model EXPORT --audio clip.flac [--minutes 1 5 10 30]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import child_request, reply, run_child


def measure(request: dict) -> dict:
    import resource
    import time

    import numpy as np
    import soundfile
    import tensorflow as tf

    clip, rate = soundfile.read(request["audio"], dtype="float32")
    pause = np.zeros(int(0.4 * rate), np.float32)
    unit = np.concatenate([clip, pause])
    total = int(request["minutes"] * 60 * rate)
    waveform = np.tile(unit, total // len(unit) + 1)[:total]
    serve = tf.saved_model.load(request["model"]).signatures["serving_default"]
    started = time.perf_counter()
    out = serve(waveform=tf.constant(waveform))
    seconds = time.perf_counter() - started
    return {
        "waveform_mib": waveform.nbytes / 2**20,
        "peak_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "seconds": seconds,
        "words": int(out["word_counts"]),
    }


def main(argv=None) -> int:
    request = child_request()
    if request is not None:
        reply(measure(request))
        return 0
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True, help="a SavedModel from asrkit export")
    parser.add_argument("--audio", required=True, help="a speech clip, repeated to each length")
    parser.add_argument("--minutes", type=float, nargs="+", default=[1, 5, 10, 30])
    args = parser.parse_args(argv)
    info = json.loads((Path(args.model) / "asrkit_export.json").read_text())
    print(f"{args.model}: windows of {info.get('window_seconds')} s + "
          f"{info.get('window_context_seconds')} s context each side")  # fmt: skip
    # the caller's waveform is held twice (NumPy and the input tensor): the rest is decoding
    print(f"{'minutes':>8} {'peak MiB':>10} {'waveform MiB':>13} {'peak less 2 x waveform':>23} "
          f"{'seconds':>9} {'words':>7}")  # fmt: skip
    for minutes in args.minutes:
        found = run_child(
            __file__, {"model": str(args.model), "audio": str(args.audio), "minutes": minutes}
        )
        rest = found["peak_mib"] - 2 * found["waveform_mib"]
        print(f"{minutes:8g} {found['peak_mib']:10.0f} {found['waveform_mib']:13.0f} {rest:23.0f} "
              f"{found['seconds']:9.1f} {found['words']:7d}", flush=True)  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
