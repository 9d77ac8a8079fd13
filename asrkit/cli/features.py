"""`asrkit features extract` (TFRecord shards) and `asrkit features cmvn` (global statistics)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def register(subparsers) -> None:
    feats = subparsers.add_parser("features", help="feature extraction")
    actions = feats.add_subparsers(dest="action", metavar="ACTION", required=True)
    extract = actions.add_parser("extract", help="log-mel features + token ids to TFRecords")
    extract.add_argument("--manifest", required=True)
    extract.add_argument("--tokenizer", required=True, help="directory of tokenizer.model")
    extract.add_argument("--out", required=True, help="directory for the shards")
    extract.add_argument("--shards", type=int, default=8)
    extract.add_argument("--speeds", default="1.0", help="speed factors, e.g. 0.9,1.0,1.1")
    extract.add_argument("--workers", type=int, default=2)
    extract.set_defaults(func=run_extract)
    cmvn = actions.add_parser("cmvn", help="per-bin mean/std over shards -> JSON")
    cmvn.add_argument("--shards", required=True, help="directory of *.tfrecord shards")
    cmvn.add_argument("--out", required=True, help="JSON file to write")
    cmvn.set_defaults(func=run_cmvn)


def run_extract(args: argparse.Namespace) -> int:
    from asrkit.data.records import write_shards
    from asrkit.tokenizer import Tokenizer

    speeds = tuple(float(s) for s in args.speeds.split(","))
    summary = write_shards(
        args.manifest,
        Tokenizer.load(args.tokenizer),
        args.out,
        num_shards=args.shards,
        speeds=speeds,
        workers=args.workers,
    )
    print(
        f"{summary.utterances} utterances, {summary.frames} frames in "
        f"{len(summary.shards) - summary.skipped_existing} new shard(s) "
        f"({summary.skipped_existing} already done) -> {args.out}"
    )
    return 0


def run_cmvn(args: argparse.Namespace) -> int:
    import tensorflow as tf

    from asrkit.data.records import parse_example
    from asrkit.features import GlobalNormalizer

    files = sorted(str(p) for p in Path(args.shards).glob("*.tfrecord"))
    if not files:
        raise SystemExit(f"asrkit features cmvn: no *.tfrecord under {args.shards}")
    records = tf.data.TFRecordDataset(files).map(lambda r: parse_example(r, 80)["features"])
    stats = GlobalNormalizer.fit(f.numpy() for f in records)
    Path(args.out).write_text(json.dumps(stats.to_dict()) + "\n")
    print(f"cmvn statistics over {len(files)} shard(s) -> {args.out}")
    return 0
