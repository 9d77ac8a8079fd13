"""`asrkit decode`: decode a shard set with a trained experiment and score it."""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path


def register(subparsers) -> None:
    decode = subparsers.add_parser("decode", help="decode shards with a trained model and score")
    decode.add_argument("--exp-dir", required=True)
    decode.add_argument("--shards", required=True, help="directory of *.tfrecord shards")
    decode.add_argument("--checkpoint", help="checkpoint directory (default: the latest)")
    decode.add_argument("--out", help="directory for hypotheses and the report")
    decode.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from asrkit.decoding.runner import decode_shards, load_experiment, normalizer_for
    from asrkit.training.trainer import pipeline_config

    model, config, tokenizer = load_experiment(args.exp_dir, args.checkpoint)
    start = time.monotonic()
    report = decode_shards(
        model, args.shards, tokenizer, pipeline_config(config), normalizer_for(config),
        config.train.max_symbols_per_step,
    )  # fmt: skip
    elapsed = time.monotonic() - start
    r = report.rates
    summary = (
        f"WER {r.wer * 100:.2f} % (S {r.substitutions}, D {r.deletions}, I {r.insertions} "
        f"of {r.words} words), CER {r.cer * 100:.2f} %, RTF {elapsed / report.audio_seconds:.3f}"
    )
    print(f"{args.shards}: {summary}")
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        pairs = zip(report.references, report.hypotheses, strict=True)
        lines = [f"REF: {ref}\nHYP: {hyp}\n" for ref, hyp in pairs]
        (out / "hypotheses.txt").write_text("\n".join(lines))
        (out / "wer.json").write_text(json.dumps({"wer": r.wer, "cer": r.cer}) + "\n")
        (out / "report.txt").write_text(summary + "\n")
    return 0
