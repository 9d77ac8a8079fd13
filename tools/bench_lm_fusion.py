"""n-gram LM fusion measured: WER without an LM, with one at each weight, and with LODR
beside it; recall of names the audio says (with `--said`); the decoding time it costs.

Decodes a manifest with an experiment by each `--methods` search: without an LM, with the
`--lm` ARPA at each `--lm-weights` value, and (with `--lodr`) each LM weight with the
low-order LM subtracted at each `--lodr-weights` value. Per setting it prints the WER over
all utterances and, with `--said` (a phrase list of names the audio holds, e.g. a corpus
made with `asrkit corpus synth --entities`), the recall of those names and the WER on the
utterances that say none of them. Then the decoding seconds of `--timed` utterances one
per call and all in one call (median and range over `--repeats`), without an LM and with
it at the first LM weight.

    python tools/bench_lm_fusion.py --exp-dir exp/mini/exp --manifest data/test-clean.jsonl \\
        --lm lm.arpa --lodr train1.arpa --lm-weights 0.2,0.4 --lodr-weights 0,0.1
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_boosting import (
    _holds_any,
    add_test_set_arguments,
    decode_texts,
    found_said,
    load_test_set,
    time_tables,
)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lm", required=True, help="ARPA over the model's pieces")
    parser.add_argument("--lodr", help="a low-order ARPA of the training transcripts")
    parser.add_argument("--lm-weights", default="0.2,0.4")
    parser.add_argument("--lodr-weights", default="0.1")
    parser.add_argument("--said", help="names the audio holds (recall)")
    add_test_set_arguments(parser)
    args = parser.parse_args(argv)

    from asrkit.decoding.fusion.boosting import read_phrases
    from asrkit.decoding.fusion.lm import lm_automaton
    from asrkit.decoding.fusion.tables import combine
    from asrkit.decoding.search.front import DecodeOptions
    from asrkit.metrics import error_rates, normalize
    from asrkit.ngram import read_arpa

    network, tokenizer, config, batches, references = load_test_set(args)
    pieces = [tokenizer.piece(i) for i in range(network.vocab_size)]
    lm = read_arpa(args.lm)
    low = read_arpa(args.lodr, "--lodr") if args.lodr else None
    said = [normalize(p.text) for p in read_phrases(args.said)] if args.said else []
    plain_rows = [i for i, r in enumerate(references) if not _holds_any(r, said)]
    print(f"{len(references)} utterances, {len(references) - len(plain_rows)} saying a name; "
          f"LM order {lm.order}" + (f", LODR order {low.order}" if low else ""))  # fmt: skip

    settings = [("no LM", None)]
    for w in map(float, args.lm_weights.split(",")):
        settings.append((f"LM {w:g}", combine(lm_automaton(lm, pieces, w))))
        for v in map(float, args.lodr_weights.split(",")) if low else ():
            tables = combine(lm_automaton(lm, pieces, w), lm_automaton(low, pieces, -v))
            settings.append((f"LM {w:g} - LODR {v:g}", tables))
    for method in args.methods.split(","):
        options = DecodeOptions(method, args.beam, config.decode.max_symbols_per_step)
        name = f"beam {args.beam}" if method == "beam" else method
        for label, tables in settings:
            hyps = decode_texts(network, tokenizer, batches, options, tables)
            line = f"{name}, {label}: WER {100 * error_rates(references, hyps).wer:.2f} %"
            if said:
                hits, total = found_said(references, hyps, said)
                clean = error_rates([references[i] for i in plain_rows],
                                    [hyps[i] for i in plain_rows])  # fmt: skip
                line += (f", recall of the names {hits}/{total}, WER without them "
                         f"{100 * clean.wer:.2f} %")  # fmt: skip
            print(line)
        time_tables(network, tokenizer, options, name, batches, args, settings[1][1],
                    ("no LM", settings[1][0]))  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
