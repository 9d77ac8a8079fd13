"""`asrkit features extract` (TFRecord shards) and `asrkit features cmvn` (global statistics).

Both take the feature settings from the training YAML's `features:` section (`--config`,
as `asrkit train` does), so shards, statistics, training and serving agree."""

from __future__ import annotations

import argparse


def register(subparsers) -> None:
    feats = subparsers.add_parser("features", help="feature extraction")
    actions = feats.add_subparsers(dest="action", metavar="ACTION", required=True)
    extract = actions.add_parser("extract", help="log-mel features + token ids to TFRecords")
    extract.add_argument("--manifest", required=True)
    extract.add_argument("--tokenizer", required=True, help="directory of tokenizer.model")
    extract.add_argument("--out", required=True, help="directory for the shards")
    extract.add_argument("--shards", type=int, default=8)
    extract.add_argument("--speeds", default="1.0", help="speed factors, e.g. 0.9,1.0,1.1")
    extract.add_argument(
        "--store", choices=("features", "audio"), default="features",
        help="what the shards hold: log-mel frames (each speed a record), or the audio as "
             "FLAC (features computed while training reads them, one of --speeds drawn per "
             "utterance per epoch; about the size of the FLAC)",
    )  # fmt: skip
    extract.add_argument("--workers", type=int, default=2)
    extract.add_argument(
        "--allow-unknown", action="store_true",
        help="a set that is only scored (dev, test): characters the tokenizer cannot encode "
             "are a warning, not an error (the references are the transcripts)",
    )  # fmt: skip
    extract.add_argument(
        "--join-seconds", type=float, default=0.0, metavar="S",
        help="join consecutive utterances of a speaker into one of up to S seconds (training "
             "data: the model learns to go on past a sentence end; 0: off)",
    )  # fmt: skip
    extract.add_argument("--join-share", type=float, default=0.5, metavar="P",
                         help="the share of utterances that start a joined one (0.5)")  # fmt: skip
    extract.add_argument(
        "--join-pause", type=float, default=0.0, metavar="S",
        help="a pause of faint noise of up to S seconds before each joined part (as in a long "
             "recording; 0: back to back)",
    )  # fmt: skip
    extract.add_argument("--join-seed", type=int, default=0)
    extract.add_argument(
        "--tarred-audio", metavar="PATTERN",
        help="a NeMo tarred dataset: its tar files (e.g. 'audio_{0..511}.tar'); --manifest is "
             "then its manifest(s), one per tar ('sharded_manifests/manifest_{0..511}.json') "
             "or one whose entries carry shard_id",
    )  # fmt: skip
    extract.add_argument(
        "--strict", action="store_true",
        help="audio that cannot be read (corrupt, truncated, a tarred entry without its "
             "member) is an error instead of skipped and listed",
    )  # fmt: skip
    add_config_arguments(extract)
    extract.set_defaults(func=run_extract)
    cmvn = actions.add_parser("cmvn", help="per-bin mean/std over shards -> JSON")
    cmvn.add_argument("--shards", required=True, help="directory of *.tfrecord shards")
    cmvn.add_argument("--out", required=True, help="JSON file to write")
    add_config_arguments(cmvn)
    cmvn.set_defaults(func=run_cmvn)


def add_config_arguments(parser) -> None:
    parser.add_argument("--config", help="YAML config whose features: section to use")
    parser.add_argument("--set", dest="overrides", action="append", default=[],
                        metavar="KEY=VALUE", help="e.g. features.num_mel_bins=64")  # fmt: skip


def _features(args):
    from asrkit.config import load_config

    return load_config(args.config, args.overrides).features


def run_extract(args: argparse.Namespace) -> int:
    from asrkit.outputs import writable_directory

    writable_directory(args.out, "--out")
    from asrkit.data.joining import JoinSettings
    from asrkit.data.records import write_shards
    from asrkit.errors import InputError
    from asrkit.tokenizer import Tokenizer

    try:
        join = JoinSettings(args.join_seconds, args.join_share, args.join_seed, args.join_pause)
    except ValueError as error:
        raise InputError(str(error)) from None

    try:
        speeds = tuple(float(s) for s in args.speeds.split(","))
    except ValueError:
        raise InputError(
            f"--speeds: expected numbers like 0.9,1.0,1.1, got {args.speeds!r}"
        ) from None
    utterances = None
    if args.tarred_audio:
        utterances = _tarred(args.manifest, args.tarred_audio, args.strict)
    summary = write_shards(
        args.manifest,
        Tokenizer.load(args.tokenizer),
        args.out,
        num_shards=args.shards,
        speeds=speeds,
        config=_features(args),
        workers=args.workers,
        join=join,
        allow_unknown=args.allow_unknown,
        store=args.store,
        utterances=utterances,
        strict=args.strict,
    )
    if summary.unreadable:
        first = "; ".join(f"{k}: {v}" for k, v in list(summary.unreadable.items())[:3])
        print(f"skipped {len(summary.unreadable)} utterance(s) whose audio cannot be read "
              f"(listed in {args.out}/shards.json; --strict refuses them): {first}")  # fmt: skip
    print(
        f"{summary.utterances} utterances, {summary.frames} frames in "
        f"{len(summary.shards) - summary.skipped_existing} new shard(s) "
        f"({summary.skipped_existing} already done) -> {args.out}"
    )
    return 0


def _tarred(manifests: str, tars: str, strict: bool):
    """The utterances of a NeMo tarred dataset; its entries without their member are named
    and skipped (refused with `strict`), members no entry names are named."""
    from asrkit.data.manifest import ManifestError
    from asrkit.data.nemo_tarred import read_tarred

    found = read_tarred(manifests, tars)
    if found.missing and strict:
        raise ManifestError(f"{len(found.missing)} entries name no member of their tar: "
                            f"{'; '.join(found.missing[:3])}")  # fmt: skip
    for what, lines in (("entries skipped: no member", found.missing),
                        ("members no entry names (not read)", found.extra)):  # fmt: skip
        if lines:
            shown = "\n  ".join(lines[:10])
            more = f"\n  ... and {len(lines) - 10} more" if len(lines) > 10 else ""
            print(f"{len(lines)} {what}:\n  {shown}{more}")
    if not found.utterances:
        raise ManifestError(f"{manifests}: no entry has its audio in {tars}")
    return found.utterances


def run_cmvn(args: argparse.Namespace) -> int:
    from pathlib import Path

    from asrkit.outputs import writable_file

    writable_file(Path(args.out).resolve(), "--out")
    from asrkit.data.records import shard_features
    from asrkit.features import GlobalNormalizer

    features = _features(args)
    files, frames = shard_features(args.shards, features)
    GlobalNormalizer.fit(f.numpy() for f in frames).save(args.out)
    print(f"cmvn statistics over {len(files)} shard(s) -> {args.out}")
    return 0
