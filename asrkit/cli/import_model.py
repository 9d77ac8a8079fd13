"""`asrkit import nemo`: a pretrained NeMo transducer as an asrkit experiment."""

from __future__ import annotations

import argparse


def register(subparsers) -> None:
    parser = subparsers.add_parser("import", help="import a pretrained model (NeMo .nemo)")
    kinds = parser.add_subparsers(dest="source", metavar="SOURCE", required=True)
    nemo = kinds.add_parser(
        "nemo", help="a NeMo Conformer/FastConformer RNN-T or TDT model (.nemo file)",
        description="Writes an asrkit experiment (config, tokenizer, checkpoint) from a NeMo "
                    "transducer, for decode / transcribe / export / plan and "
                    "`asrkit train --init-from`. torch and NeMo are not needed.",
    )  # fmt: skip
    nemo.add_argument("model", metavar="MODEL.nemo")
    nemo.add_argument("--exp-dir", required=True, help="the new experiment (absent or empty)")
    nemo.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from pathlib import Path

    from asrkit.errors import InputError
    from asrkit.outputs import writable_directory

    model, exp_dir = Path(args.model), Path(args.exp_dir)
    if not model.is_file():
        raise InputError(f"{model}: no such .nemo file")
    if exp_dir.exists() and (not exp_dir.is_dir() or any(exp_dir.iterdir())):
        raise InputError(
            f"--exp-dir {exp_dir}: exists and is not an empty directory; import into a new one"
        )
    writable_directory(exp_dir.parent, "--exp-dir", shown=exp_dir)
    from asrkit.importers.nemo_model import import_nemo

    summary = import_nemo(model, exp_dir)
    print(describe(summary, model))
    return 0


def describe(summary, model) -> str:
    config = summary.plan.config
    enc, pred, feats = config.model.encoder, config.model.predictor, config.features
    arch = "FastConformer" if enc.subsampling == "dw_striding" else "Conformer"
    kind = summary.plan.kind
    lines = [
        f"imported {model} -> {summary.exp_dir}",
        f"  model: {arch}-{kind}, {summary.parameters:,} parameters: {enc.num_blocks} blocks "
        f"of d_model {enc.d_model}, {enc.num_heads} heads, kernel {enc.kernel_size}, "
        f"{enc.subsampling} x{enc.subsampling_factor}; predictor {pred.num_layers} x LSTM "
        f"{pred.units}; joint {config.model.joint_dim} ({config.model.joint_activation})"
        + (f"; durations {list(config.model.durations)}" if config.model.durations else "")
        + ("; a CTC head (--method ctc)" if config.model.ctc_head else ""),
        f"  vocabulary: {summary.vocabulary} SentencePiece pieces + blank"
        f" ({'lower-case: hypotheses are upper-cased' if summary.lower_case else 'cased'})",
        f"  features: NeMo log-mel, {feats.num_mel_bins} bins, window {feats.frame_length} / "
        f"hop {feats.frame_step} samples at {feats.sample_rate} Hz, n_fft {feats.fft_length}, "
        f"normalize {feats.normalize}",
        f"  decoding: greedy, at most {config.decode.max_symbols_per_step} symbols per frame",
        *streaming_settings(enc),
        f"  training: {training_settings(config)}",
    ]
    lines += [f"  note: {note}" for note in summary.plan.notes]
    return "\n".join(lines)


def streaming_settings(enc) -> list[str]:
    """A cache-aware streaming model's look-aheads, in one line (none for full context)."""
    if not enc.chunk_frames:
        return []
    left = "all" if enc.left_chunks < 0 else f"{enc.left_chunks * enc.chunk_frames}"
    aheads = ", ".join(str(a) for a in (enc.lookaheads or (enc.chunk_frames - 1,)))
    return [f"  streaming: cache-aware, left context {left} frames, look-aheads {aheads} "
            f"frames (default {enc.chunk_frames - 1}; --lookahead-frames; transcribe "
            "--streaming, export --streaming)"]  # fmt: skip


def training_settings(config) -> str:
    """The NeMo training settings as the import mapped them, in one line."""
    loss, data, enc = config.loss, config.data, config.model.encoder
    parts = [f"loss {loss.kind} normalised by {loss.normalize_by}"]
    if loss.ctc_weight:
        parts.append(f"(1 - {loss.ctc_weight}) x transducer + {loss.ctc_weight} x CTC"
                     if loss.ctc_interpolate else f"+ {loss.ctc_weight} x CTC")  # fmt: skip
    if enc.stochastic_depth:
        parts.append(f"stochastic depth {enc.stochastic_depth:g} ({enc.stochastic_depth_mode})")
    if loss.fastemit_lambda:
        parts.append(f"FastEmit {loss.fastemit_lambda}")
    if data.spec_augment:
        width = (f"{data.spec_time_frames} frames" if data.spec_time_frames
                 else f"{data.spec_time_width:g} of the utterance")  # fmt: skip
        parts.append(f"SpecAugment {data.spec_freq_masks} x {data.spec_freq_width} bins, "
                     f"{data.spec_time_masks} x {width}")  # fmt: skip
    else:
        parts.append("no SpecAugment")
    rates = [enc.dropout, enc.attention_dropout, enc.pre_encoder_dropout]
    parts.append(
        "dropout "
        + "/".join(f"{enc.dropout if r is None else r:g}" for r in rates)
        + f" (blocks/attention/pre-encoder), predictor {config.model.predictor.dropout:g}"
    )
    return "; ".join(parts)
