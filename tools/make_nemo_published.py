"""Builds NeMo transducers of the published shapes, randomly initialised, as `.nemo` files.

For measuring fine-tuning at the sizes people use (import, plan, train, average, export;
asrkit beside NeMo on the same update) without downloading checkpoints: NeMo itself builds
the model from the shape's config and saves it with `save_to`, so the archive is what a
published checkpoint of that shape looks like (config, tokenizer, weights), only untrained.
Run with the Python of a venv that has NeMo (asrkit never imports torch or NeMo):

    /path/nemo-venv/bin/python tools/make_nemo_published.py --shape fastconformer_rnnt_114m \
        --text corpus_transcripts.txt --out models/fc_114m.nemo

Shapes (`SHAPES`): NeMo's `fast-conformer_transducer_bpe.yaml` template as published
(FastConformer-Transducer Large, 17 x 512, 114 M parameters), Parakeet-TDT-0.6B-v2 (24 x 1024,
128 mel bins, no xscaling, no biases, a 2-layer predictor, TDT durations 0-4) and the same
encoder as a plain RNN-T (the Parakeet-RNNT-0.6B shape: NeMo's TDT losses need CUDA, so on a
CPU NeMo can only train this one beside asrkit), and the cache-aware streaming
FastConformer-Transducer (the 114 M one with causal subsampling and convolutions, LayerNorm
convolutions, unnormalised features and chunked_limited attention with the look-aheads 13,
6, 1 and 0 frames of the published multi-look-ahead model). Training settings are the template's
(dropout, SpecAugment, AdamW betas and weight decay, `rnnt_reduction`, the fused joint).

The tokenizer is a SentencePiece BPE model of `--vocab` pieces (1024, as published) trained
on `--text` (one transcript per line), as NeMo's tokenizer script makes them.

A random model's greedy search emits on most frames, up to its symbols limit, where a
trained one emits a token every few frames: then the search, not the encoder, holds the
time, and a speed comparison measures a model nobody has. `--emit-like MANIFEST` (audio
with transcripts: an asrkit or a NeMo manifest) makes the archive emit as a trained model
would on that audio. The joint's output layer is first scaled by `SHARPEN` (a random
joint's logits spread about half a nat, so its probabilities are nearly flat where a
trained joint's are peaked: what beam search's pruning sees), then the blank's output
bias is set (by bisection) so that NeMo's greedy search emits as many tokens over the
manifest as its transcripts have pieces; the tokens per second of speech are printed with
the archive (and stated with every figure measured on it). Its decisions stay closer to
ties than a trained model's: bfloat16 arithmetic changes about 5 % of them. A random
0.6 B encoder's frames are too alike for this (on the LibriVox clips its count fell from
over 110 to 1 within 0.016 of bias): such a model is refused, and nothing is written.
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
import tempfile
import time
from pathlib import Path

PREPROCESSOR = {
    "_target_": "nemo.collections.asr.modules.AudioToMelSpectrogramPreprocessor",
    "sample_rate": 16000, "normalize": "per_feature", "window_size": 0.025,
    "window_stride": 0.01, "window": "hann", "features": 80, "n_fft": 512,
    "frame_splicing": 1, "dither": 1e-5, "pad_to": 0,
}  # fmt: skip

# fast-conformer_transducer_bpe.yaml's model section (the training and data sections aside).
TEMPLATE = {
    "sample_rate": 16000,
    "rnnt_reduction": "mean_volume",
    "model_defaults": {"enc_hidden": 512, "pred_hidden": 640, "joint_hidden": 640},
    "preprocessor": PREPROCESSOR,
    "spec_augment": {"_target_": "nemo.collections.asr.modules.SpectrogramAugmentation",
                     "freq_masks": 2, "time_masks": 10, "freq_width": 27, "time_width": 0.05},
    "encoder": {
        "_target_": "nemo.collections.asr.modules.ConformerEncoder", "feat_in": 80,
        "feat_out": -1, "n_layers": 17, "d_model": 512, "subsampling": "dw_striding",
        "subsampling_factor": 8, "subsampling_conv_channels": 256,
        "causal_downsampling": False, "ff_expansion_factor": 4,
        "self_attention_model": "rel_pos", "n_heads": 8, "att_context_size": [-1, -1],
        "xscaling": True, "untie_biases": True, "pos_emb_max_len": 5000,
        "conv_kernel_size": 9, "conv_norm_type": "batch_norm", "dropout": 0.1,
        "dropout_pre_encoder": 0.1, "dropout_emb": 0.0, "dropout_att": 0.1,
        "stochastic_depth_drop_prob": 0.0,
    },
    "decoder": {"_target_": "nemo.collections.asr.modules.RNNTDecoder",
                "normalization_mode": None, "random_state_sampling": False,
                "blank_as_pad": True,
                "prednet": {"pred_hidden": 640, "pred_rnn_layers": 1, "t_max": None,
                            "dropout": 0.2}},
    "joint": {"_target_": "nemo.collections.asr.modules.RNNTJoint", "log_softmax": None,
              "preserve_memory": False, "fuse_loss_wer": True, "fused_batch_size": 4,
              "jointnet": {"joint_hidden": 640, "activation": "relu", "dropout": 0.2}},
    "decoding": {"strategy": "greedy_batch", "greedy": {"max_symbols": 10}},
    "loss": {"loss_name": "default",
             "warprnnt_numba_kwargs": {"fastemit_lambda": 0.0, "clamp": -1.0}},
    "optim": {"name": "adamw", "lr": 5e-3, "betas": [0.9, 0.98], "weight_decay": 1e-3,
              "sched": {"name": "CosineAnnealing", "warmup_steps": 15000, "min_lr": 5e-4}},
}  # fmt: skip

DURATIONS = [0, 1, 2, 3, 4]
XL_ENCODER = {"n_layers": 24, "d_model": 1024}


# fastconformer_transducer_bpe_streaming.yaml's encoder changes (NeMo's cache-aware
# streaming FastConformer), with the look-aheads of the published multi-look-ahead model.
STREAMING = {
    "causal_downsampling": True, "att_context_style": "chunked_limited",
    "att_context_size": [[70, 13], [70, 6], [70, 1], [70, 0]],
    "conv_context_size": "causal", "conv_norm_type": "layer_norm",
}  # fmt: skip


def _shape(name: str) -> dict:
    config = copy.deepcopy(TEMPLATE)
    if name == "fastconformer_rnnt_114m":
        return config
    if name == "fastconformer_streaming_114m":
        config["preprocessor"]["normalize"] = "NA"
        config["encoder"].update(STREAMING)
        return config
    config["encoder"].update(XL_ENCODER)
    config["model_defaults"]["enc_hidden"] = 1024
    if name == "parakeet_rnnt_0.6b":
        return config
    # parakeet_tdt_0.6b (v2): 128 mel bins, no xscaling, no biases, a 2-layer predictor, TDT.
    config["preprocessor"]["features"] = config["encoder"]["feat_in"] = 128
    config["encoder"].update(xscaling=False, use_bias=False)
    config["decoder"]["prednet"]["pred_rnn_layers"] = 2
    config["joint"]["num_extra_outputs"] = len(DURATIONS)
    config["model_defaults"]["tdt_durations"] = DURATIONS
    config["decoding"].update(model_type="tdt", durations=DURATIONS)
    tdt = {"fastemit_lambda": 0.0, "clamp": -1.0, "durations": DURATIONS, "sigma": 0.02,
           "omega": 0.1}  # fmt: skip
    config["loss"] = {"loss_name": "tdt", "tdt_kwargs": tdt}
    return config


SHAPES = ("fastconformer_rnnt_114m", "fastconformer_streaming_114m", "parakeet_rnnt_0.6b",
          "parakeet_tdt_0.6b")  # fmt: skip


def _refuse(message: str) -> None:
    print(f"make_nemo_published.py: {message}", file=sys.stderr)
    sys.exit(2)


def _tokenizer(text: Path, vocab: int, directory: Path) -> Path:
    import sentencepiece

    lines = [line.strip() for line in text.read_text(encoding="utf-8").splitlines()]
    lines = [line for line in lines if line]
    if not lines:
        _refuse(f"{text} has no transcripts (one per line)")
    sentencepiece.SentencePieceTrainer.train(
        sentence_iterator=iter(lines), model_prefix=str(directory / "tokenizer"),
        vocab_size=vocab, model_type="bpe", character_coverage=1.0, unk_id=0, bos_id=-1,
        eos_id=-1, minloglevel=2, hard_vocab_limit=False,
    )  # fmt: skip
    vocab_lines = (directory / "tokenizer.vocab").read_text().splitlines()
    pieces = [line.split("\t")[0] for line in vocab_lines]
    (directory / "vocab.txt").write_text("\n".join(pieces) + "\n")
    return directory


SHARPEN = 16.0  # --emit-like: the joint's output layer scaled by this (confident decisions)


def _manifest_audio(manifest: Path) -> list[tuple[str, str]]:
    """(audio path, transcript) of each line of an asrkit (`audio_path`) or NeMo
    (`audio_filepath`) manifest; relative paths from the manifest's directory."""
    rows = []
    for number, line in enumerate(manifest.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        row = json.loads(line)
        path = row.get("audio_path") or row.get("audio_filepath")
        if not path or "text" not in row:
            _refuse(f"{manifest}:{number}: wants audio_path (or audio_filepath) and text")
        rows.append((str((manifest.parent / path).resolve()), row["text"]))
    if not rows:
        _refuse(f"{manifest}: no utterances")
    return rows


def _emit_like(model, manifest: Path) -> dict:
    """Sets the joint's blank bias so that greedy search emits over `manifest`'s audio as
    many tokens as its transcripts have pieces (a trained model's count) -> the figures."""
    import soundfile
    import torch

    rows = _manifest_audio(manifest)
    target = sum(len(model.tokenizer.text_to_ids(text)) for _, text in rows)
    model.eval()
    encoded, seconds = [], 0.0
    with torch.no_grad():
        for path, _ in rows:
            wave, rate = soundfile.read(path, dtype="float32")
            seconds += len(wave) / rate
            signal = torch.from_numpy(wave)[None]
            feats, lengths = model.preprocessor(input_signal=signal,
                                                length=torch.tensor([len(wave)]))  # fmt: skip
            encoded.append(model.encoder(audio_signal=feats, length=lengths))
    out = model.joint.joint_net[-1]  # Linear(joint_hidden, V + 1 (+ durations)); blank: V
    blank = model.tokenizer.vocab_size
    with torch.no_grad():
        out.weight.mul_(SHARPEN)
        out.bias.mul_(SHARPEN)
    original = float(out.bias[blank])

    def emitted(shift: float) -> int:
        with torch.no_grad():
            out.bias[blank] = original + shift
            hyps = [model.decoding.rnnt_decoder_predictions_tensor(e, n)[0]
                    for e, n in encoded]  # fmt: skip
        return sum(len(h.y_sequence) for h in hyps)

    low, high = -10.0 * SHARPEN, 40.0 * SHARPEN  # more blank bias, fewer emissions
    for _ in range(30):
        middle = (low + high) / 2
        low, high = (middle, high) if emitted(middle) > target else (low, middle)
        if high - low < 1e-3 * SHARPEN:
            break
    count = emitted(high)
    if abs(count - target) > 0.2 * target:  # no bias in between: the count jumps across it
        _refuse(
            f"--emit-like: the emissions jump from {emitted(low)} to {count} around a blank "
            f"bias of {original + high:.3f} and never come near the transcripts' {target} "
            "pieces: this random model's encoder frames are too alike (a deep random encoder's "
            "are) to emit like a trained model; no archive written"
        )
    return {
        "joint_scaled_by": SHARPEN,
        "blank_bias": round(original + high, 4),
        "emitted": count,
        "pieces": target,
        "audio_seconds": round(seconds, 2),
        "tokens_per_second": round(count / seconds, 2),
        "frames_emitting": round(count / sum(int(n[0]) for _, n in encoded), 3),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", choices=SHAPES, required=True)
    parser.add_argument("--text", type=Path, required=True,
                        help="transcripts to train the tokenizer on, one per line")  # fmt: skip
    parser.add_argument("--vocab", type=int, default=1024)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, required=True, help="the .nemo file to write")
    parser.add_argument("--emit-like", type=Path, metavar="MANIFEST",
                        help="audio with transcripts: set the blank bias so that greedy search "
                             "emits as many tokens as the transcripts have pieces")  # fmt: skip
    args = parser.parse_args()
    if args.out.exists():
        _refuse(f"{args.out} exists; remove it or name another --out")
    if not args.text.is_file():
        _refuse(f"--text {args.text}: no such file")
    if args.emit_like and not args.emit_like.is_file():
        _refuse(f"--emit-like {args.emit_like}: no such file")
    if args.emit_like and "tdt" in args.shape:
        _refuse("--emit-like: for the RNN-T shapes (a TDT joint's durations move the count too)")

    import torch
    from nemo.collections.asr.models import EncDecRNNTBPEModel
    from omegaconf import OmegaConf

    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as scratch:
        config = _shape(args.shape)
        config["tokenizer"] = {"dir": str(_tokenizer(args.text, args.vocab, Path(scratch))),
                               "type": "bpe"}  # fmt: skip
        torch.manual_seed(args.seed)
        model = EncDecRNNTBPEModel(cfg=OmegaConf.create(config))
        emission = _emit_like(model, args.emit_like) if args.emit_like else {}
        args.out.parent.mkdir(parents=True, exist_ok=True)
        model.save_to(str(args.out))
    parameters = sum(p.numel() for p in model.parameters())
    print(json.dumps({"shape": args.shape, "parameters": parameters,
                      "vocabulary": model.tokenizer.vocab_size, "out": str(args.out),
                      "seconds": round(time.perf_counter() - start, 1), **emission}))  # fmt: skip


if __name__ == "__main__":
    main()
