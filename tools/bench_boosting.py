"""Word boosting measured: recall of the boosted phrases that were said, WER on the
sentences without them, false alarms, and the decoding time it costs.

Decodes a manifest with an experiment, without boosting and with the `--boost` list at each
`--weights` value, by each `--methods` search. `--said` lists the phrases the audio holds
(a corpus made with `asrkit corpus synth --entities`); the boost list may hold distractors
too. Per setting it prints:

- recall: occurrences of a `--said` phrase in a reference found in its hypothesis;
- WER on the utterances whose reference holds no boosted phrase, and over all;
- false alarms: utterances whose reference holds no boosted phrase but whose hypothesis does;
- decoding seconds of `--timed` utterances one per call and all in one call (median and
  range over `--repeats`), without and with boosting.

    python tools/bench_boosting.py --exp-dir exp/mini/exp --manifest ent/data/test-clean.jsonl \\
        --boost boost.txt --said entities.txt --weights 0.5,1,2 --methods greedy,beam
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import timed


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--boost", required=True, help="the phrase list boosted")
    parser.add_argument("--said", required=True, help="the phrases the audio holds")
    parser.add_argument("--weights", default="0.5,1,2", help="bonus per piece, comma-separated")
    add_test_set_arguments(parser)
    args = parser.parse_args(argv)

    from asrkit.decoding.fusion.boosting import load_boost, read_phrases
    from asrkit.decoding.fusion.tables import combine
    from asrkit.decoding.search.front import DecodeOptions
    from asrkit.metrics import error_rates, normalize

    network, tokenizer, config, batches, references = load_test_set(args)
    boosted = [normalize(p.text) for p in read_phrases(args.boost)]
    said = [normalize(p.text) for p in read_phrases(args.said)]
    plain_rows = [i for i, r in enumerate(references) if not _holds_any(r, boosted)]
    print(f"{len(references)} utterances, {len(references) - len(plain_rows)} with a boosted "
          f"phrase; {len(boosted)} phrases boosted, {len(said)} of them said")  # fmt: skip

    def decode(options, boost):
        return decode_texts(network, tokenizer, batches, options, boost)

    weights = [float(w) for w in args.weights.split(",")]
    for method in args.methods.split(","):
        options = DecodeOptions(method, args.beam, config.decode.max_symbols_per_step)
        name = f"beam {args.beam}" if method == "beam" else method
        for weight in [None, *weights]:
            boost = None if weight is None else combine(load_boost(
                args.boost, tokenizer, network.vocab_size, weight
            ))  # fmt: skip
            hyps = decode(options, boost)
            hits, total = found_said(references, hyps, said)
            alarms = sum(_holds_any(hyps[i], boosted) for i in plain_rows)
            clean = error_rates([references[i] for i in plain_rows], [hyps[i] for i in plain_rows])
            everything = error_rates(references, hyps)
            label = "no boosting" if weight is None else f"boost weight {weight:g}"
            recall = 100 * hits / max(total, 1)
            print(f"{name}, {label}: recall {hits}/{total} ({recall:.1f} %), WER without "
                  f"boosted phrases {100 * clean.wer:.2f} %, all {100 * everything.wer:.2f} %, "
                  f"false alarms {alarms}/{len(plain_rows)}")  # fmt: skip
        _time(network, tokenizer, options, name, batches, args, max(weights))
    return 0


def add_test_set_arguments(parser) -> None:
    """The experiment, the manifest and the searches a decoding bench runs."""
    parser.add_argument("--exp-dir", required=True)
    parser.add_argument("--manifest", required=True)
    parser.add_argument("--methods", default="greedy,beam")
    parser.add_argument("--beam", type=int, default=4)
    parser.add_argument("--average", type=int, default=2)
    parser.add_argument("--timed", type=int, default=16, help="utterances timed")
    parser.add_argument("--repeats", type=int, default=3)


def found_said(references, hyps, said) -> tuple[int, int]:
    """(occurrences of a `said` phrase in a reference that its hypothesis holds too, all
    occurrences in the references)."""
    hits = total = 0
    for ref, hyp in zip(references, hyps, strict=True):
        for phrase in said:
            n = _count(ref, phrase)
            total, hits = total + n, hits + min(n, _count(hyp, phrase))
    return hits, total


def load_test_set(args):
    """The experiment (`--exp-dir`, `--average`) and `--manifest` featurised in batches of
    16: (network, tokenizer, config, batches, normalised references)."""
    from asrkit.audio import read_audio
    from asrkit.data.manifest import read_manifest
    from asrkit.decoding.recogniser import Recogniser
    from asrkit.decoding.runner import padded_waveforms
    from asrkit.experiment import load_experiment
    from asrkit.metrics import normalize

    experiment = load_experiment(args.exp_dir, average=args.average)
    network, tokenizer, config = experiment.network, experiment.tokenizer, experiment.config
    utts = read_manifest(args.manifest)
    audio = [read_audio(u.audio_path, config.features.sample_rate) for u in utts]
    featurise = Recogniser.of(experiment).featurise
    groups = [list(range(i, min(i + 16, len(utts)))) for i in range(0, len(utts), 16)]
    batches = [featurise(*padded_waveforms([audio[i] for i in g])) for g in groups]
    return network, tokenizer, config, batches, [normalize(u.text) for u in utts]


def decode_texts(network, tokenizer, batches, options, boost) -> list[str]:
    """Each utterance's normalised hypothesis."""
    from asrkit.decoding.search.front import decode_batch
    from asrkit.metrics import normalize

    texts = []
    for batch in batches:
        found = decode_batch(network, *batch, tokenizer, options, boost)
        texts += [h.text for h in found]
    return [normalize(t) for t in texts]


def time_tables(network, tokenizer, options, name, batches, args, tables, labels) -> None:
    """Seconds to decode `args.timed` utterances one per call and all in one call, without
    and with `tables` (median and range over `args.repeats`), and the ratio."""
    import numpy as np

    from asrkit.decoding.search.front import decode_batch

    shortest = min(int(feats.shape[1]) for feats, _ in batches)
    feats = np.concatenate([np.asarray(f)[:, :shortest] for f, _ in batches])[: args.timed]
    lengths = np.full([len(feats)], feats.shape[1], np.int32)
    plain, fused = labels
    for per_call in (1, len(feats)):
        figures = {}
        for label, boost in ((plain, None), (fused, tables)):

            def run(boost=boost, per_call=per_call):
                for i in range(0, len(feats), per_call):
                    decode_batch(network, feats[i : i + per_call], lengths[i : i + per_call],
                                 tokenizer, options, boost)  # fmt: skip

            figures[label] = timed(run, repeats=args.repeats)
        ratio = figures[fused].median / figures[plain].median
        print(f"{name}, {len(feats)} utterances, {per_call} per call: {plain} "
              f"{figures[plain].format('.3f')} s, {fused} {figures[fused].format('.3f')} s "
              f"(x{ratio:.2f})")  # fmt: skip


def _time(network, tokenizer, options, name, batches, args, weight):
    from asrkit.decoding.fusion.boosting import load_boost
    from asrkit.decoding.fusion.tables import combine

    boost = combine(load_boost(args.boost, tokenizer, network.vocab_size, weight))
    time_tables(network, tokenizer, options, name, batches, args, boost, ("no boost", "boost"))


def _count(text: str, phrase: str) -> int:
    return len(re.findall(rf"(?<!\S){re.escape(phrase)}(?!\S)", text))


def _holds_any(text: str, phrases) -> bool:
    return any(_count(text, p) for p in phrases)


if __name__ == "__main__":
    sys.exit(main())
