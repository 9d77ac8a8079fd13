"""Greedy search's look-ahead window: search time per window size on one experiment.

The greedy searches take their decisions `window` frames at a time (`asrkit.decoding.greedy`
for RNN-T, `asrkit.decoding.tdt_greedy` for TDT); every window size finds the same tokens.
This times the search alone (encoder outputs computed beforehand) for each size, at 1 and
16 utterances per call, and checks that the tokens equal those of the first size:

    python tools/bench_greedy_window.py --exp-dir EXP --manifest data/test-clean.jsonl \
        [--utterances 64] [--windows 1 2 4 8 16 32] [--repeats 5]

Printed: search RTF (search wall time / audio duration), median (min) over the repeats.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--exp-dir", required=True, help="an RNN-T or TDT experiment")
    parser.add_argument("--manifest", required=True, help="asrkit manifest (.jsonl) of audio")
    parser.add_argument("--utterances", type=int, default=64)
    parser.add_argument("--windows", type=int, nargs="+", default=[1, 2, 4, 8, 16, 32])
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    import soundfile
    import tensorflow as tf

    from asrkit.decoding.greedy import greedy_search
    from asrkit.decoding.runner import featurise_samples
    from asrkit.decoding.tdt_greedy import tdt_greedy_search
    from asrkit.experiment import load_experiment

    experiment = load_experiment(args.exp_dir)
    network, config = experiment.network, experiment.config
    lines = Path(args.manifest).read_text().splitlines()
    utterances = [json.loads(line) for line in lines if line.strip()][: args.utterances]
    waves = [soundfile.read(u["audio_path"], dtype="float32")[0] for u in utterances]
    seconds = sum(len(w) for w in waves) / 16000
    encode = tf.function(lambda f, n: network.encode(f, n, training=False),
                         reduce_retracing=True, autograph=False)  # fmt: skip
    symbols = config.decode.max_symbols_per_step
    greedy = tdt_greedy_search if network.joint.durations else greedy_search
    for per_call in (1, 16):
        groups = [waves[i : i + per_call] for i in range(0, len(waves), per_call)]
        batches = [featurise_samples(g, config.features, experiment.normalizer) for g in groups]
        encoded = [encode(b.features, b.feature_lengths) for b in batches]
        first = None
        for window in args.windows:
            search = tf.function(
                lambda e, n, window=window: greedy(network, e, n, symbols, window=window),
                reduce_retracing=True, autograph=False,
            )  # fmt: skip
            tokens = [search(e, n).tokens.numpy().tolist() for e, n in encoded]  # warm-up
            first = tokens if first is None else first
            times = []
            for _ in range(args.repeats):
                start = time.perf_counter()
                for e, n in encoded:
                    search(e, n).scores.numpy()
                times.append(time.perf_counter() - start)
            print(f"{per_call:2d} per call, window {window:2d}: search RTF "
                  f"{statistics.median(times) / seconds:.5f} (min {min(times) / seconds:.5f}); "
                  f"tokens as window {args.windows[0]}: {tokens == first}", flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
