"""Trains a small NeMo Conformer-Transducer with NeMo on an asrkit corpus: a real pretrained
model to import and fine-tune (recipes/finetune/README.md, "A real fine-tuning run").

NeMo runs in its own venv (asrkit never imports torch or NeMo); this script re-starts
itself with `--nemo-python`:

    python tools/train_nemo_reference.py --nemo-python /path/nemo-venv/bin/python \
        --data exp/mini/data --out exp/nemo_ref [--epochs 30] [--seed 0]

The open recipe's shape (recipes/open/conf/conformer_open.yaml) as near as NeMo's modules
come, stopped at a number of updates and scored on dev along the way, for a comparison at
equal updates with the recipe's training log:

    python tools/train_nemo_reference.py --nemo-python NEMO_PY --data W/data --out nemo_open \
        --shape open --updates 1551 --eval-every 517

`--data` holds asrkit manifests (`asrkit prepare librispeech`: train-clean-100, dev-clean
and test-clean .jsonl). Written to `--out`: `model.nemo` (NeMo's `save_to`), and
`nemo_decode.json` with NeMo's greedy_batch transcripts of the test set, its WER (NeMo's
`word_error_rate` on asrkit's normalisation of both sides) and the training log (with the
dev WER at each `--eval-every`).

The network, features, SpecAugment, predictor, joint, decoding and the saved archive are
NeMo's own (EncDecRNNTBPEModel). The training loop is a plain PyTorch loop instead of
Lightning's, and the RNN-T loss is the vectorised forward recursion of
`make_nemo_fixtures.rnnt_loss` (autograd), checked against NeMo's RNNTLoss on the first
batch: NeMo's CPU loss (numba) takes about 11 s per batch of 16 here.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import re
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def _normalize(text: str) -> str:  # asrkit.metrics.normalize's rule (scoring only)
    return " ".join(re.sub(r"[^A-Z' ]", " ", text.upper()).split())


def _manifest(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _tokenizer(train: list[dict], out: Path, vocab: int, kind: str) -> Path:
    """A SentencePiece model (`kind` bpe or unigram) as NeMo's tokenizer script makes them
    (`<unk>` at 0, no bos/eos), on the lower-cased training transcripts."""
    import sentencepiece

    directory = out / "tokenizer"
    directory.mkdir(parents=True, exist_ok=True)
    sentencepiece.SentencePieceTrainer.train(
        sentence_iterator=iter([u["text"].lower() for u in train]),
        model_prefix=str(directory / "tokenizer"), vocab_size=vocab, model_type=kind,
        character_coverage=1.0, unk_id=0, bos_id=-1, eos_id=-1, minloglevel=2,
    )  # fmt: skip
    pieces = [line.split("\t")[0] for line in (directory / "tokenizer.vocab").open()]
    (directory / "vocab.txt").write_text("\n".join(pieces) + "\n")
    return directory


SHAPES = {
    # the layout of NeMo's conformer_transducer_bpe.yaml, sized for 2 CPU cores
    "small": {"predictor": "lstm", "pred_hidden": 128, "joint_hidden": 192,
              "conv_norm": "batch_norm", "ctc_weight": 0.0},
    # recipes/open/conf/conformer_open.yaml's: a stateless predictor over the last 2
    # labels (NeMo's embeds them into 128 in all, asrkit embeds and projects to 320), a
    # joint of 320, LayerNorm in the convolution module, a CTC head added at 0.3
    "open": {"predictor": "stateless", "pred_hidden": 128, "joint_hidden": 320,
             "conv_norm": "layer_norm", "ctc_weight": 0.3},
}  # fmt: skip


def _config(tokenizer: Path, d_model: int, blocks: int, shape: dict) -> dict:
    """A Conformer-Transducer (hybrid with a CTC head when the shape has a CTC weight)."""
    if shape["predictor"] == "stateless":
        decoder = {
            "_target_": "nemo.collections.asr.modules.StatelessTransducerDecoder",
            "context_size": 2, "normalization_mode": None,
            "prednet": {"pred_hidden": shape["pred_hidden"], "dropout": 0.1},
        }  # fmt: skip
    else:
        decoder = {
            "_target_": "nemo.collections.asr.modules.RNNTDecoder", "normalization_mode": None,
            "random_state_sampling": False, "blank_as_pad": True,
            "prednet": {"pred_hidden": shape["pred_hidden"], "pred_rnn_layers": 1,
                        "t_max": None, "dropout": 0.1},
        }  # fmt: skip
    config = {
        "sample_rate": 16000,
        "tokenizer": {"dir": str(tokenizer), "type": "bpe"},  # NeMo's name for any SPM
        "preprocessor": {
            "_target_": "nemo.collections.asr.modules.AudioToMelSpectrogramPreprocessor",
            "sample_rate": 16000, "normalize": "per_feature", "window_size": 0.025,
            "window_stride": 0.01, "window": "hann", "features": 80, "n_fft": 512,
            "log": True, "dither": 1e-5, "pad_to": 0, "frame_splicing": 1,
        },
        "spec_augment": {
            "_target_": "nemo.collections.asr.modules.SpectrogramAugmentation",
            "freq_masks": 2, "freq_width": 15, "time_masks": 2, "time_width": 0.05,
        },
        "encoder": {
            "_target_": "nemo.collections.asr.modules.ConformerEncoder", "feat_in": 80,
            "n_layers": blocks, "d_model": d_model, "n_heads": 4, "ff_expansion_factor": 4,
            "subsampling": "striding", "subsampling_factor": 4,
            "subsampling_conv_channels": 64, "self_attention_model": "rel_pos",
            "xscaling": True, "untie_biases": True, "conv_kernel_size": 15,
            "conv_norm_type": shape["conv_norm"], "dropout": 0.1, "dropout_pre_encoder": 0.1,
            "dropout_emb": 0.0, "dropout_att": 0.1,
        },
        "decoder": decoder,
        "joint": {
            "_target_": "nemo.collections.asr.modules.RNNTJoint", "log_softmax": None,
            "preserve_memory": False, "fuse_loss_wer": False,
            "jointnet": {"joint_hidden": shape["joint_hidden"], "activation": "relu",
                         "dropout": 0.1},
        },
        "decoding": {"strategy": "greedy_batch", "greedy": {"max_symbols": 10}},
        "model_defaults": {"enc_hidden": d_model, "pred_hidden": shape["pred_hidden"]},
    }  # fmt: skip
    if shape["ctc_weight"]:
        config["aux_ctc"] = {
            "ctc_loss_weight": shape["ctc_weight"],
            "decoder": {"_target_": "nemo.collections.asr.modules.ConvASRDecoder",
                        "feat_in": d_model, "num_classes": -1, "vocabulary": []},
            "decoding": {"strategy": "greedy"},
        }  # fmt: skip
    return config


def _batches(utterances: list[dict], seconds: float, rng: random.Random) -> list[list[int]]:
    """Indices in batches of at most `seconds` of padded audio, similar lengths together."""
    order = sorted(range(len(utterances)), key=lambda i: utterances[i]["duration"])
    batches, current = [], []
    for i in order:
        if current and utterances[i]["duration"] * (len(current) + 1) > seconds:
            batches.append(current)
            current = []
        current.append(i)
    if current:
        batches.append(current)
    rng.shuffle(batches)
    return batches


def _pad(arrays, dtype):
    import torch

    lengths = torch.tensor([len(a) for a in arrays])
    batch = torch.zeros(len(arrays), int(lengths.max()), dtype=dtype)
    for i, a in enumerate(arrays):
        batch[i, : len(a)] = torch.as_tensor(a, dtype=dtype)
    return batch, lengths


def _greedy(model, waves, batch_size: int = 16) -> list[str]:
    import torch

    texts = []
    with torch.no_grad():
        for start in range(0, len(waves), batch_size):
            audio, lengths = _pad(waves[start : start + batch_size], torch.float32)
            encoded, encoded_lengths = model.forward(
                input_signal=audio, input_signal_length=lengths
            )
            hyps = model.decoding.rnnt_decoder_predictions_tensor(
                encoder_output=encoded, encoded_lengths=encoded_lengths
            )
            texts += [h.text for h in hyps]
    return texts


def _wer(model, utterances: list[dict]) -> tuple[float, list[str]]:
    import soundfile
    from nemo.collections.asr.metrics.wer import word_error_rate

    waves = [soundfile.read(u["audio_path"], dtype="float32")[0] for u in utterances]
    model.eval()
    hypotheses = _greedy(model, waves)
    references = [_normalize(u["text"]) for u in utterances]
    return word_error_rate([_normalize(h) for h in hypotheses], references), hypotheses


def train(args) -> None:
    import numpy as np
    import soundfile
    import torch
    from make_nemo_fixtures import rnnt_loss
    from nemo.collections.asr.losses.rnnt import RNNTLoss
    from nemo.collections.asr.models import EncDecHybridRNNTCTCBPEModel, EncDecRNNTBPEModel
    from omegaconf import OmegaConf

    torch.set_num_threads(os.cpu_count() or 1)
    torch.manual_seed(args.seed)
    rng = random.Random(args.seed)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    data = Path(args.data)
    train_set = _manifest(data / "train-clean-100.jsonl")
    test_set = _manifest(data / "test-clean.jsonl")
    dev_set = _manifest(data / "dev-clean.jsonl") if args.eval_every else []
    shape = SHAPES[args.shape]
    tokenizer = _tokenizer(train_set, out, args.vocab, args.tokenizer)
    config = OmegaConf.create(_config(tokenizer, args.d_model, args.blocks, shape))
    hybrid = bool(shape["ctc_weight"])
    kind = EncDecHybridRNNTCTCBPEModel if hybrid else EncDecRNNTBPEModel
    model = kind(cfg=config)
    vocab = model.tokenizer.vocab_size
    parameters = sum(p.numel() for p in model.parameters())
    print(f"{parameters / 1e6:.2f} M parameters, vocabulary {vocab}", flush=True)
    waves = [soundfile.read(u["audio_path"], dtype="float32")[0] for u in train_set]
    tokens = [model.tokenizer.text_to_ids(u["text"].lower()) for u in train_set]

    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, args.beta2),
                                  weight_decay=1e-3)  # fmt: skip
    per_epoch = len(_batches(train_set, args.batch_seconds, random.Random(0)))
    total = args.updates or per_epoch * args.epochs

    def rate(step: int) -> float:  # linear warm-up, then cosine to a tenth or 1/sqrt
        if step < args.warmup:
            return (step + 1) / args.warmup
        if args.schedule == "inverse_sqrt":
            return math.sqrt(args.warmup / (step + 1))
        progress = (step - args.warmup) / max(1, total - args.warmup)
        return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress))

    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, rate)
    log, step, start, epoch = [], 0, time.time(), 0
    while step < total:
        epoch += 1
        model.train()
        sums = [0.0, 0]
        for batch in _batches(train_set, args.batch_seconds, rng):
            audio, lengths = _pad([waves[i] for i in batch], torch.float32)
            targets, target_lengths = _pad([tokens[i] for i in batch], torch.int64)
            encoded, encoded_lengths = model.forward(
                input_signal=audio, input_signal_length=lengths
            )
            predicted, _, _ = model.decoder(targets=targets, target_length=target_lengths)
            joint = model.joint(encoder_outputs=encoded, decoder_outputs=predicted)
            losses = rnnt_loss(joint, targets, encoded_lengths, target_lengths)
            if step == 0:  # the loss is NeMo's (its numba kernel, once: it is slow on a CPU)
                with torch.no_grad():
                    nemo = RNNTLoss(num_classes=vocab, reduction=None)(
                        log_probs=joint, targets=targets, input_lengths=encoded_lengths,
                        target_lengths=target_lengths,
                    )  # fmt: skip
                assert torch.allclose(losses, nemo, rtol=1e-4), (losses, nemo)
            total_loss = losses.sum()
            if hybrid:  # added to the transducer's, as asrkit's loss.ctc_weight
                log_probs = model.ctc_decoder(encoder_output=encoded)
                ctc = torch.nn.functional.ctc_loss(
                    log_probs.transpose(0, 1), targets, encoded_lengths, target_lengths,
                    blank=vocab, reduction="sum", zero_infinity=True,
                )  # fmt: skip
                total_loss = total_loss + shape["ctc_weight"] * ctc
            loss = total_loss / target_lengths.sum()  # per token, as asrkit's default
            optimizer.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 5.0)
            optimizer.step()
            schedule.step()
            step += 1
            sums[0] += float(losses.detach().sum())
            sums[1] += int(target_lengths.sum())
            if args.eval_every and step % args.eval_every == 0:
                wer, _ = _wer(model, dev_set)
                entry = {"updates": step, "dev_wer": round(100 * wer, 2),
                         "seconds": round(time.time() - start, 1)}  # fmt: skip
                log.append(entry)
                print(json.dumps(entry), flush=True)
                model.train()
            if step >= total:
                break
        entry = {"epoch": epoch, "updates": step, "loss_per_token": sums[0] / sums[1],
                 "seconds": round(time.time() - start, 1)}  # fmt: skip
        log.append(entry)
        print(json.dumps(entry), flush=True)

    model.eval()
    model.save_to(str(out / "model.nemo"))
    model = kind.restore_from(str(out / "model.nemo"), map_location="cpu")
    wer, hypotheses = _wer(model, test_set)
    print(f"NeMo greedy_batch test WER {100 * wer:.2f} % ({len(test_set)} utterances)")
    (out / "nemo_decode.json").write_text(json.dumps({
        "wer": wer, "parameters": parameters, "vocab": vocab, "train_log": log,
        "seconds": round(time.time() - start, 1), "settings": vars(args),
        "hypotheses": {u["id"]: h for u, h in zip(test_set, hypotheses, strict=True)},
        "numpy": np.__version__, "torch": torch.__version__,
    }, indent=1) + "\n")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nemo-python", help="the Python of a venv with nemo-toolkit[asr]")
    parser.add_argument("--data", required=True, help="directory of asrkit manifests")
    parser.add_argument("--out", required=True)
    parser.add_argument("--epochs", type=int, default=12)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--shape", choices=sorted(SHAPES), default="small",
                        help="predictor, joint, convolution norm and CTC head; with open, "
                        "the other settings default to the open recipe's")  # fmt: skip
    parser.add_argument("--vocab", type=int)
    parser.add_argument("--tokenizer", choices=("bpe", "unigram"))
    parser.add_argument("--d-model", type=int)
    parser.add_argument("--blocks", type=int)
    parser.add_argument("--batch-seconds", type=float)
    parser.add_argument("--lr", type=float)
    parser.add_argument("--warmup", type=int, default=300)
    parser.add_argument("--schedule", choices=("cosine", "inverse_sqrt"))
    parser.add_argument("--beta2", type=float, help="AdamW's second-moment decay")
    parser.add_argument(
        "--updates", type=int, default=0, help="stop after this many updates (instead of --epochs)"
    )
    parser.add_argument(
        "--eval-every", type=int, default=0, help="greedy dev-clean WER every this many updates"
    )
    args = parser.parse_args()
    defaults = {  # small: the settings RESULTS.md's mini-corpus runs used; open: the recipe's
        "small": {"vocab": 64, "tokenizer": "bpe", "d_model": 96, "blocks": 4,
                  "batch_seconds": 30.0, "lr": 2e-3, "schedule": "cosine", "beta2": 0.98},
        "open": {"vocab": 256, "tokenizer": "unigram", "d_model": 144, "blocks": 6,
                 "batch_seconds": 60.0, "lr": 3e-3, "schedule": "inverse_sqrt", "beta2": 0.999},
    }[args.shape]  # fmt: skip
    for key, value in defaults.items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    if args.nemo_python:  # start again under it, without the flag
        if not os.access(args.nemo_python, os.X_OK):
            print(f"train_nemo_reference.py: --nemo-python {args.nemo_python}: not an "
                  "executable Python", file=sys.stderr)  # fmt: skip
            sys.exit(2)
        argv = sys.argv[1:]
        i = next(i for i, a in enumerate(argv) if a.startswith("--nemo-python"))
        argv = argv[:i] + argv[i + (1 if "=" in argv[i] else 2) :]
        sys.exit(subprocess.call([args.nemo_python, __file__, *argv]))
    try:
        import nemo  # noqa: F401
    except ImportError:
        print("train_nemo_reference.py: NeMo is not importable here; give --nemo-python",
              file=sys.stderr)  # fmt: skip
        sys.exit(2)
    sys.path.insert(0, str(HERE))
    train(args)


if __name__ == "__main__":
    main()
