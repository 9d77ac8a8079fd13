"""`asrkit decode`: decode a test set with a trained experiment and score it."""

from __future__ import annotations

import argparse
import json

from asrkit.cli.options import (
    add_chunk_argument,
    add_fusion_arguments,
    add_precision_argument,
    add_search_arguments,
    add_weights_arguments,
    check_before_loading,
    check_search_arguments,
    search_options,
)


def register(subparsers) -> None:
    decode = subparsers.add_parser(
        "decode", help="decode a test set with a trained model and score"
    )
    decode.add_argument("--exp-dir", required=True)
    source = decode.add_mutually_exclusive_group(required=True)
    source.add_argument("--shards", help="directory of *.tfrecord shards (asrkit features extract)")
    source.add_argument("--manifest", help="JSONL manifest (audio is read and featurised here)")
    add_search_arguments(decode)
    add_fusion_arguments(decode)
    add_weights_arguments(decode)
    add_chunk_argument(decode)
    add_precision_argument(decode)
    decode.add_argument(
        "--normalizer", choices=("none", "basic", "english"), default="basic",
        help="how both texts are normalised before scoring: none (exact), basic (case-folded, "
             "punctuation removed, every letter and digit kept; the default), english (the "
             "Open ASR Leaderboard's English normaliser)",
    )  # fmt: skip
    decode.add_argument("--worst", type=int, default=10, help="worst utterances to list")
    decode.add_argument("--out", help="directory for hypotheses and the report")
    decode.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from asrkit.data.manifest import read_usable_manifest
    from asrkit.experiment import load_experiment_config
    from asrkit.outputs import writable_directory, write_files

    fusion = check_search_arguments(args)  # the phrase list and LMs read, once
    out = writable_directory(args.out, "--out") if args.out else None
    # before TensorFlow: is it an experiment at all, can it do what is asked?
    recorded = load_experiment_config(args.exp_dir)  # read once, here
    check_before_loading(args, recorded, fusion)
    if args.manifest:
        read_usable_manifest(args.manifest)
    from asrkit.data.pipeline import pipeline_config
    from asrkit.data.records import check_shards
    from asrkit.decoding.recogniser import Recogniser
    from asrkit.decoding.runner import decode_manifest, decode_shards
    from asrkit.experiment import load_experiment

    experiment = load_experiment(args.exp_dir, args.checkpoint, args.average, args.chunk_frames,
                                 config=recorded, precision=args.precision)  # fmt: skip
    network, config, tokenizer = experiment.network, experiment.config, experiment.tokenizer
    options = search_options(args, config)
    boost = fusion.tables(tokenizer, network.vocab_size, config.decode,
                          nemo_ids=config.features.lm_tokens_by_id)  # fmt: skip
    recogniser = Recogniser.of(experiment, options)
    if args.shards:
        check_shards(args.shards, config, tokenizer)
        report = decode_shards(recogniser, args.shards, tokenizer, pipeline_config(config),
                               args.normalizer, boost)  # fmt: skip
    else:
        report = decode_manifest(recogniser, args.manifest, tokenizer, config.data.batch_seconds,
                                 args.normalizer, boost)  # fmt: skip
    r = report.rates
    weights = experiment.weights
    method = f"beam {args.beam}" if args.method == "beam" else args.method
    fused = fusion.spec.weights(config.decode)
    if args.boost:
        method += f", boosting {args.boost} (weight {fused['boost_weight']:g})"
    if args.lm:
        method += f", LM {args.lm} (weight {fused['lm_weight']:g})"
        if args.lodr:
            method += f" - LODR {args.lodr} (weight {fused['lodr_weight']:g})"
    summary = (
        f"{args.shards or args.manifest}: {method}, weights {weights}: WER {r.wer * 100:.2f} % "
        f"(S {r.substitutions}, D {r.deletions}, I {r.insertions} of {r.words} words), "
        f"CER {r.cer * 100:.2f} %, {len(report.utterances)} utterances, RTF {report.rtf:.3f}, "
        f"{r.normalizer} normaliser"
    )
    print(summary)
    worst = report.worst(args.worst)
    lines = [summary, "", f"worst {len(worst)} utterances (word errors / words):"]
    for u in worst:
        lines += [
            f"{u.id} ({u.errors}/{u.words})",
            f"  REF: {u.reference}",
            f"  HYP: {u.hypothesis}",
        ]
    if out is not None:
        scores = {"wer": r.wer, "cer": r.cer, "substitutions": r.substitutions,
                  "deletions": r.deletions, "insertions": r.insertions, "words": r.words,
                  "utterances": len(report.utterances), "rtf": report.rtf, "method": method,
                  "weights": weights, "normalizer": r.normalizer, **fused}  # fmt: skip
        write_files(out, {
            "hyp.txt": "".join(f"{u.id} {u.hypothesis}\n" for u in report.utterances),
            "ref.txt": "".join(f"{u.id} {u.reference}\n" for u in report.utterances),
            "wer.json": json.dumps(scores, indent=1) + "\n",
            "report.txt": "\n".join(lines) + "\n",
        })  # fmt: skip
        print(f"hypotheses and report -> {out}")
    return 0
