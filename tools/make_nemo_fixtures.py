"""Writes the NeMo reference fixtures of `tests/importers/` with NeMo itself.

Run with the Python of a venv that has NeMo (never asrkit's; asrkit and its tests never
import torch or NeMo):

    python3.11 -m venv /path/nemo-venv
    /path/nemo-venv/bin/pip install "nemo-toolkit[asr]==3.0.0"
    /path/nemo-venv/bin/python tools/make_nemo_fixtures.py --out tests/data/nemo

Features (`features.npz`): NeMo's AudioToMelSpectrogramPreprocessor (eval mode: no dither)
on the real clips of tests/data/realspeech, batched with their lengths, for each setting in
FEATURE_SETTINGS (the stt_en Conformer/FastConformer front end, and a 64-bin variant with
other window, no normalisation and pad_to 16); with each its `fb` and `window` buffers.

Relative-position attention (`rel_attention.ckpt` / `.npz`): NeMo's
RelPositionMultiHeadAttention with random weights and position biases on a padded batch.

Encoders (`conformer_x4.ckpt`, `fastconformer_x8.ckpt`, `encoders.npz` / `.json`): tiny
random-init NeMo ConformerEncoders (striding x4 with xscaling; dw_striding x8 without) with
randomised BatchNorm statistics, run on NeMo's features of the real clips.

Whole models (`rnnt.nemo`, `tdt.nemo`, `models.npz` / `.json`): two small NeMo transducers
(a Conformer RNN-T, striding x4; a FastConformer TDT, dw_striding x8) trained here for a few
CPU minutes on the clips' transcripts, saved with NeMo's `save_to`, then restored from the
archive: their encoder frames, predictor states, joint log-probs at sampled cells, RNN-T
losses and greedy_batch tokens and frames on the clips.

Adapters (`adapters.nemo`, `adapters.npz` / `.json`): `rnnt.nemo` with a NeMo
LinearAdapter on its encoder (randomised) and a disabled second one; NeMo's encoder frames
and greedy tokens with the adapter enabled. Written from the archive (`--parts adapters`).

BatchNorm in train mode (`batch_norm.npz`): NeMo's default fine-tuning step on the
`step_conformer_rnnt.nemo` batch with every BatchNorm from the batch's statistics: the
gradients and the running statistics after it (`--parts batch_norm`, from the steps).

Beam searches (`beams.json`): NeMo's batched beam searches on the committed `rnnt.nemo`
and `tdt.nemo` (malsd_batch, beam 4, unnormalised scores): each clip's best tokens, frames
and score. Written from the archives alone (`--parts beams`), so the other fixtures stay.

A tarred dataset (`tarred/`): NeMo's own scripts/speech_recognition/
convert_to_tarred_audio_dataset.py (from a NeMo checkout: `--nemo-repo`) on three real clips
and a 0.8 s segment of one (an entry with an offset): two `audio_N.tar` shards (FLAC), the
sharded manifests, `tarred_audio_manifest.json` and `metadata.yaml` (`--parts tarred`).

TDT losses (`tdt_losses.npz`): NeMo's PyTorch reference TDT loss and its gradient on random
logits (its `.cuda()` calls made no-ops in this script only).

Training steps (`step_*.nemo`, `steps.npz`, `steps.json`): four tiny NeMo models with the
published templates' training settings — a Conformer RNN-T (mean_batch, FastEmit), a
FastConformer TDT (mean_volume, sigma), a hybrid FastConformer TDT-CTC (CTC weight 0.3) and
a hybrid FastConformer RNN-T-CTC whose losses are divided by different counts (mean_volume
RNN-T, mean_batch CTC, as NeMo's hybrid configs ship them)
— and NeMo's own `training_step` on the clips with dropout and BatchNorm in eval mode and
SpecAugment off (NeMo's TDT loss through its PyTorch reference): the loss, every
parameter's gradient, the parameters after one torch AdamW update, and the gradient NeMo's
own accumulation (Lightning's mean of two micro-batches' means) gives instead. The hybrid's
CTC greedy output on the clips too (its CTC head's weights scaled up, so that frames' best
symbols are clear), and NeMo's CPU RNN-T loss with FastEmit on random
logits (loss and gradient).
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CLIPS = sorted((ROOT / "tests/data/realspeech/test-real").rglob("*.flac"))

FEATURE_SETTINGS = {
    "conformer": dict(sample_rate=16000, window_size=0.025, window_stride=0.01, window="hann",
                      features=80, n_fft=512, normalize="per_feature", log=True, dither=1e-5,
                      pad_to=0, frame_splicing=1),
    "variant": dict(sample_rate=16000, window_size=0.02, window_stride=0.01, window="hann",
                    features=64, n_fft=None, normalize="NA", log=True, dither=1e-5,
                    pad_to=16, frame_splicing=1, lowfreq=0, highfreq=7000),
}  # fmt: skip


def _nemo_search(model, batch, lengths):
    """NeMo's features, encoder frames and its configured search on a padded batch (NumPy
    waveforms [B, S] and lengths [B]): (feats, feat_lengths, encoded, encoded_lengths,
    hypotheses)."""
    import torch

    with torch.no_grad():
        feats, feat_lengths = model.preprocessor(
            input_signal=torch.from_numpy(batch), length=torch.from_numpy(lengths)
        )
        encoded, encoded_lengths = model.encoder(audio_signal=feats, length=feat_lengths)
        hyps = model.decoding.rnnt_decoder_predictions_tensor(
            encoder_output=encoded, encoded_lengths=encoded_lengths, return_hypotheses=True
        )
    return feats, feat_lengths, encoded, encoded_lengths, hyps


def _clip_batch():
    """The real clips: their lengths and one zero-padded float32 batch of them."""
    import numpy as np
    import soundfile

    waves = [soundfile.read(p, dtype="float32")[0] for p in CLIPS]
    lengths = np.array([len(w) for w in waves])
    batch = np.zeros((len(waves), lengths.max()), np.float32)
    for i, w in enumerate(waves):
        batch[i, : len(w)] = w
    return lengths, batch


def features(out: Path) -> None:
    import numpy as np
    import torch
    from nemo.collections.asr.modules import AudioToMelSpectrogramPreprocessor

    lengths, batch = _clip_batch()
    arrays = {"lengths": lengths}
    for name, settings in FEATURE_SETTINGS.items():
        pre = AudioToMelSpectrogramPreprocessor(**settings).eval()
        with torch.no_grad():
            feats, feat_lengths = pre(
                input_signal=torch.from_numpy(batch), length=torch.from_numpy(lengths)
            )
        arrays[f"{name}/features"] = feats.numpy()  # [B, F, T] as NeMo lays them out
        arrays[f"{name}/lengths"] = feat_lengths.numpy()
        arrays[f"{name}/fb"] = pre.featurizer.fb.numpy()[0]
        arrays[f"{name}/window"] = pre.featurizer.window.numpy()
    np.savez_compressed(out / "features.npz", **arrays)
    (out / "features.json").write_text(json.dumps(
        {"clips": [str(p.relative_to(ROOT)) for p in CLIPS], "settings": FEATURE_SETTINGS},
        indent=1,
    ) + "\n")  # fmt: skip


def attention(out: Path) -> None:
    """NeMo's relative-position self-attention (Transformer-XL positions, untied biases)
    on a padded batch: its weights, inputs and output (`rel_attention.*`)."""
    import numpy as np
    import torch
    from nemo.collections.asr.parts.submodules.multi_head_attention import (
        RelPositionalEncoding,
        RelPositionMultiHeadAttention,
    )

    torch.manual_seed(1)
    d_model, heads, frames = 16, 4, 9
    attention = RelPositionMultiHeadAttention(heads, d_model, 0.0, None, None).eval()
    with torch.no_grad():  # NeMo initialises the biases to 0: make them count
        attention.pos_bias_u.normal_()
        attention.pos_bias_v.normal_()
    positions = RelPositionalEncoding(d_model, dropout_rate=0.0, xscale=None).eval()
    positions.extend_pe(frames, torch.device("cpu"), torch.float32)
    x = torch.randn(2, frames, d_model)
    lengths = torch.tensor([frames, 6])
    valid = torch.arange(frames)[None] < lengths[:, None]
    masked = ~(valid[:, :, None] & valid[:, None, :])
    with torch.no_grad():
        x_out, pos_emb = positions(x)
        y = attention(x_out, x_out, x_out, masked, pos_emb)
    torch.save(attention.state_dict(), out / "rel_attention.ckpt")
    np.savez(out / "rel_attention.npz", x=x.numpy(), lengths=lengths.numpy(), y=y.numpy(),
             pos_emb=pos_emb.numpy())  # fmt: skip


ENCODERS = {
    "conformer_x4": dict(subsampling="striding", subsampling_factor=4, xscaling=True,
                         subsampling_conv_channels=16),
    "fastconformer_x8": dict(subsampling="dw_striding", subsampling_factor=8, xscaling=False,
                             subsampling_conv_channels=16),
}  # fmt: skip


def encoders(out: Path) -> None:
    """Tiny random-init NeMo ConformerEncoders (eval mode, BatchNorm running statistics
    randomised) on NeMo's features of the real clips: state dict, config, output."""
    import numpy as np
    import torch
    from nemo.collections.asr.modules import ConformerEncoder

    data = np.load(out / "features.npz")
    features = torch.from_numpy(data["conformer/features"])  # [B, 80, T]
    lengths = torch.from_numpy(data["conformer/lengths"])
    arrays, configs = {}, {}
    for name, kind in ENCODERS.items():
        torch.manual_seed(2)
        config = dict(feat_in=80, n_layers=2, d_model=32, n_heads=4, ff_expansion_factor=4,
                      self_attention_model="rel_pos", untie_biases=True, conv_kernel_size=9,
                      conv_norm_type="batch_norm", dropout=0.0, dropout_pre_encoder=0.0,
                      dropout_emb=0.0, dropout_att=0.0, **kind)  # fmt: skip
        encoder = ConformerEncoder(**config)
        with torch.no_grad():
            for module in encoder.modules():
                if isinstance(module, torch.nn.BatchNorm1d):
                    module.running_mean.normal_(0, 0.5)
                    module.running_var.uniform_(0.5, 2.0)
                    module.weight.normal_(1, 0.2)
                    module.bias.normal_(0, 0.2)
                if hasattr(module, "pos_bias_u") and module.pos_bias_u is not None:
                    module.pos_bias_u.normal_(0, 0.2)
                    module.pos_bias_v.normal_(0, 0.2)
        encoder.eval()
        with torch.no_grad():
            encoded, encoded_lengths = encoder(audio_signal=features, length=lengths)
        torch.save(encoder.state_dict(), out / f"{name}.ckpt")
        arrays[f"{name}/encoded"] = encoded.numpy()  # [B, D, T']
        arrays[f"{name}/lengths"] = encoded_lengths.numpy()
        configs[name] = config
    np.savez_compressed(out / "encoders.npz", **arrays)
    (out / "encoders.json").write_text(json.dumps(configs, indent=1) + "\n")


TEXTS = ROOT / "tests/data/realspeech/test-real/9002/90021/9002-90021.trans.txt"
MODELS = {
    # a Conformer-Transducer (striding x4) and a FastConformer-TDT (dw_striding x8), tiny
    "rnnt": dict(subsampling="striding", subsampling_factor=4, xscaling=True, tdt=False),
    "tdt": dict(subsampling="dw_striding", subsampling_factor=8, xscaling=False, tdt=True),
}
DURATIONS = [0, 1, 2, 3, 4]


def rnnt_loss(logits, targets, input_lengths, target_lengths):
    """Per-utterance RNN-T losses of logits [B, T, U+1, V+1] (blank last), by the forward
    recursion one label row at a time: along t each row is a linear recurrence in log
    space, alpha[t, u] = C[t] + logcumsumexp_s(e[s] - C[s]) with C the cumulative blank
    log-probs. Only to train the fixture models quickly (NeMo's CPU loss loops in Python);
    the fixtures' reference losses are NeMo's own."""
    import torch

    log_probs = logits.log_softmax(-1)
    batch, frames, rows, _ = log_probs.shape
    blank = log_probs[..., -1]  # [B, T, U+1]
    index = targets[:, None, :, None].expand(batch, frames, rows - 1, 1)
    label = log_probs[:, :, :-1, :].gather(3, index)[..., 0]  # [B, T, U]
    cumulative = torch.cat([torch.zeros(batch, 1, rows), blank.cumsum(1)[:, :-1]], dim=1)
    alpha = [cumulative[:, :, 0]]
    for u in range(1, rows):
        arrive = alpha[-1] + label[:, :, u - 1]
        c = cumulative[:, :, u]
        alpha.append(c + torch.logcumsumexp(arrive - c, dim=1))
    alpha = torch.stack(alpha, dim=2)
    b = torch.arange(batch)
    last = input_lengths - 1
    return -(alpha[b, last, target_lengths] + blank[b, last, target_lengths])


def _overfit(model, batch, lengths, targets, target_lengths, steps: int = 400) -> None:
    """Trains the tiny model on the clips' own transcripts for a few CPU minutes, so that it
    decodes like a trained model: mostly blanks, varied tokens. A TDT model's token outputs
    are trained with the RNN-T loss (NeMo's TDT loss needs CUDA); its duration outputs keep
    their random initialisation, so greedy TDT search skips frames irregularly."""
    import torch

    vocab = model.tokenizer.vocab_size
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    model.train()
    for step in range(steps):
        # A copy: in training mode NeMo's preprocessor adds its dither to the input in place.
        feats, feat_lengths = model.preprocessor(input_signal=batch.clone(), length=lengths)
        encoded, encoded_lengths = model.encoder(audio_signal=feats, length=feat_lengths)
        predicted, _, _ = model.decoder(targets=targets, target_length=target_lengths)
        joint = model.joint.joint_after_projection(
            model.joint.project_encoder(encoded.transpose(1, 2)),
            model.joint.project_prednet(predicted.transpose(1, 2)),
        )
        loss = rnnt_loss(joint[..., : vocab + 1], targets, encoded_lengths,
                          target_lengths).mean()  # fmt: skip
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if step % 20 == 0:
            print(f"  step {step}: loss {float(loss):.3f}", flush=True)
    model.eval()


def _randomise_statistics(model) -> None:
    """BatchNorm running statistics and the attention's position biases drawn at random, so
    that they count (NeMo initialises them to 0 and 1)."""
    import torch

    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, torch.nn.BatchNorm1d):
                module.running_mean.normal_(0, 0.5)
                module.running_var.uniform_(0.5, 2.0)
            if hasattr(module, "pos_bias_u") and module.pos_bias_u is not None:
                module.pos_bias_u.normal_(0, 0.2)
                module.pos_bias_v.normal_(0, 0.2)


def _padded(tokens: list[list[int]]):
    """Token lists as a zero-padded int64 batch and their lengths."""
    import numpy as np

    targets = np.zeros((len(tokens), max(len(t) for t in tokens)), np.int64)
    for i, t in enumerate(tokens):
        targets[i, : len(t)] = t
    return targets, np.array([len(t) for t in tokens])


def _tokenizer(out: Path) -> Path:
    """A 48-piece BPE SentencePiece model as NeMo's tokenizer script makes them (`<unk>`
    at id 0, no bos/eos), trained on the clips' transcripts (lower case)."""
    import sentencepiece

    directory = out / "nemo_tokenizer"
    directory.mkdir(exist_ok=True)
    lines = [line.split(" ", 1)[1].lower() for line in TEXTS.read_text().splitlines()]
    sentencepiece.SentencePieceTrainer.train(
        sentence_iterator=iter(lines * 20), model_prefix=str(directory / "tokenizer"),
        vocab_size=48, model_type="bpe", character_coverage=1.0, unk_id=0, bos_id=-1,
        eos_id=-1, minloglevel=2,
    )  # fmt: skip
    pieces = [
        line.split("\t")[0] for line in (directory / "tokenizer.vocab").read_text().splitlines()
    ]
    (directory / "vocab.txt").write_text("\n".join(pieces) + "\n")  # NeMo registers it too
    return directory


def _model_config(tokenizer: Path, name: str) -> dict:
    kind = dict(MODELS[name])
    tdt = kind.pop("tdt")
    config = {
        "sample_rate": 16000,
        "tokenizer": {"dir": str(tokenizer), "type": "bpe"},
        "preprocessor": {"_target_": "nemo.collections.asr.modules."
                         "AudioToMelSpectrogramPreprocessor", **FEATURE_SETTINGS["conformer"]},
        "encoder": {"_target_": "nemo.collections.asr.modules.ConformerEncoder", "feat_in": 80,
                    "n_layers": 2, "d_model": 32, "n_heads": 4, "ff_expansion_factor": 4,
                    "self_attention_model": "rel_pos", "untie_biases": True,
                    "conv_kernel_size": 9, "conv_norm_type": "batch_norm", "dropout": 0.0,
                    "dropout_pre_encoder": 0.0, "dropout_emb": 0.0, "dropout_att": 0.0,
                    "subsampling_conv_channels": 16, **kind},
        "decoder": {"_target_": "nemo.collections.asr.modules.RNNTDecoder",
                    "normalization_mode": None, "random_state_sampling": False,
                    "blank_as_pad": True,
                    "prednet": {"pred_hidden": 24, "pred_rnn_layers": 2, "t_max": None,
                                "dropout": 0.0}},
        "joint": {"_target_": "nemo.collections.asr.modules.RNNTJoint", "log_softmax": None,
                  "preserve_memory": False, "fuse_loss_wer": False, "fused_batch_size": 4,
                  "jointnet": {"joint_hidden": 40, "activation": "relu", "dropout": 0.0}},
        "decoding": {"strategy": "greedy_batch", "greedy": {"max_symbols": 5}},
        "model_defaults": {"enc_hidden": 32, "pred_hidden": 24},
    }  # fmt: skip
    if tdt:
        config["joint"]["num_extra_outputs"] = len(DURATIONS)
        config["decoding"].update(model_type="tdt", durations=DURATIONS)
        config["loss"] = {
            "loss_name": "tdt",
            "tdt_kwargs": {"durations": DURATIONS, "sigma": 0.02, "omega": 0.1},
        }
    return config


def models(out: Path) -> None:
    """Whole tiny NeMo transducers saved as .nemo archives (random init, BatchNorm
    statistics and the joint's output randomised so that greedy search emits tokens), with
    NeMo's own outputs on the real clips: encoder frames, the predictor and joint on the
    transcripts' tokens, and greedy_batch's tokens (and TDT's frames)."""
    import numpy as np
    import torch
    from nemo.collections.asr.losses.rnnt import RNNTLoss
    from nemo.collections.asr.models import EncDecRNNTBPEModel
    from omegaconf import OmegaConf

    tokenizer = _tokenizer(out)
    lengths, batch = _clip_batch()
    lines = [line.split(" ", 1)[1].lower() for line in TEXTS.read_text().splitlines()]
    arrays, summary = {}, {}
    for name in MODELS:
        torch.manual_seed(3)
        model = EncDecRNNTBPEModel(cfg=OmegaConf.create(_model_config(tokenizer, name)))
        _randomise_statistics(model)
        with torch.no_grad():
            out_layer = model.joint.joint_net[-1]
            if out_layer.bias.shape[0] > model.tokenizer.vocab_size + 1:  # TDT durations
                out_layer.bias[model.tokenizer.vocab_size + 1 :].normal_(0, 1.0)
        tokens = [model.tokenizer.text_to_ids(t) for t in lines]
        targets, target_lengths = _padded(tokens)
        _overfit(model, torch.from_numpy(batch), torch.from_numpy(lengths),
                 torch.from_numpy(targets), torch.from_numpy(target_lengths))  # fmt: skip
        model.save_to(str(out / f"{name}.nemo"))
        # NeMo's outputs are those of the archive as NeMo restores it (eval mode).
        model = EncDecRNNTBPEModel.restore_from(str(out / f"{name}.nemo"), map_location="cpu")
        model.eval()
        with torch.no_grad():
            feats, feat_lengths = model.preprocessor(
                input_signal=torch.from_numpy(batch), length=torch.from_numpy(lengths)
            )
            encoded, encoded_lengths = model.encoder(audio_signal=feats, length=feat_lengths)
            predicted, _, _ = model.decoder(
                targets=torch.from_numpy(targets), target_length=torch.from_numpy(target_lengths)
            )
            joint = model.joint.joint(encoded.transpose(1, 2), predicted.transpose(1, 2))
            vocab = model.tokenizer.vocab_size
            losses = RNNTLoss(num_classes=vocab, reduction=None)(
                log_probs=joint[..., : vocab + 1], targets=torch.from_numpy(targets),
                input_lengths=encoded_lengths, target_lengths=torch.from_numpy(target_lengths),
            )  # fmt: skip
            mine = rnnt_loss(joint[..., : vocab + 1], torch.from_numpy(targets), encoded_lengths,
                              torch.from_numpy(target_lengths))  # fmt: skip
            assert torch.allclose(mine, losses, rtol=1e-3), (mine, losses)  # the training loss
            hyps = model.decoding.rnnt_decoder_predictions_tensor(
                encoder_output=encoded, encoded_lengths=encoded_lengths, return_hypotheses=True
            )
        arrays[f"{name}/encoded"] = encoded.numpy()
        arrays[f"{name}/encoded_lengths"] = encoded_lengths.numpy()
        arrays[f"{name}/targets"] = targets
        arrays[f"{name}/rnnt_losses"] = losses.numpy()  # NeMo's RNN-T loss of the token logits
        arrays[f"{name}/target_lengths"] = target_lengths
        arrays[f"{name}/predicted"] = predicted.numpy()  # [B, D, U+1]
        # the joint [B, T, U+1, V+1 (+ durations)] at 400 random (b, t, u) points
        rng = np.random.default_rng(0)
        b = rng.integers(0, len(tokens), 400)
        t = rng.integers(0, encoded_lengths.numpy()[b])
        u = rng.integers(0, target_lengths[b] + 1)
        arrays[f"{name}/joint_at"] = np.stack([b, t, u], axis=1)
        arrays[f"{name}/joint"] = joint.numpy()[b, t, u]
        summary[name] = {
            "greedy": [[int(t) for t in h.y_sequence] for h in hyps],
            "frames": [[int(t) for t in h.timestamp] for h in hyps],
            "text": [model.tokenizer.ids_to_text([int(t) for t in h.y_sequence]) for h in hyps],
        }
    shutil.rmtree(tokenizer)  # a build input only: each .nemo holds its copy
    np.savez_compressed(out / "models.npz", **arrays)
    (out / "models.json").write_text(json.dumps(
        {"clips": [str(p.relative_to(ROOT)) for p in CLIPS], "lines": lines, **summary},
        indent=1,
    ) + "\n")  # fmt: skip


BEAM = 4


def beams(out: Path) -> None:
    """NeMo's malsd_batch beam search (beam BEAM, scores not length-normalised) on the
    committed archives, restored as NeMo restores them: the best hypothesis of each clip."""
    from nemo.collections.asr.models import EncDecRNNTBPEModel
    from omegaconf import OmegaConf, open_dict

    lengths, batch = _clip_batch()
    summary = {"beam": BEAM}
    for name in MODELS:
        model = EncDecRNNTBPEModel.restore_from(str(out / f"{name}.nemo"), map_location="cpu")
        model.eval()
        decoding = OmegaConf.to_container(model.cfg.decoding, resolve=True)
        decoding.update(strategy="malsd_batch")
        decoding["beam"] = dict(beam_size=BEAM, score_norm=False, return_best_hypothesis=True,
                                max_symbols=decoding["greedy"]["max_symbols"],
                                allow_cuda_graphs=False)  # fmt: skip
        cfg = OmegaConf.create(decoding)
        with open_dict(cfg):
            model.change_decoding_strategy(cfg, verbose=False)
        *_, hyps = _nemo_search(model, batch, lengths)
        summary[name] = {
            "tokens": [[int(t) for t in h.y_sequence] for h in hyps],
            "frames": [[int(t) for t in h.timestamp] for h in hyps],
            "scores": [float(h.score) for h in hyps],
        }
    (out / "beams.json").write_text(json.dumps(summary, indent=1) + "\n")


TDT_CASES = {
    # name: (batch, frames, labels, vocab incl. blank, durations, sigma)
    "small": (2, 6, 3, 5, [0, 1, 2], 0.0),
    "sigma": (3, 9, 4, 7, [0, 1, 2, 3, 4], 0.05),
    "no_zero": (2, 7, 2, 4, [1, 2, 4], 0.02),
}


def tdt_losses(out: Path) -> None:
    """NeMo's PyTorch reference TDT loss (`TDTLossPytorch`; its two `.cuda()` calls made
    no-ops here, in this script only) and its autograd gradient on random logits: per
    utterance losses and the gradient of their sum w.r.t. the token and duration logits,
    with padded frames and labels (`tdt_losses.npz`; logits laid out [B, T, U+1, V + D],
    NeMo's blank last)."""
    import numpy as np
    import torch
    from nemo.collections.asr.losses.rnnt_pytorch import TDTLossPytorch

    torch.Tensor.cuda = lambda self, *args, **kwargs: self  # the reference runs on CPU
    arrays = {}
    for name, (b, t, u, v, durations, sigma) in TDT_CASES.items():
        rng = np.random.default_rng(len(name))
        acts = torch.tensor(rng.standard_normal((b, t, u + 1, v + len(durations))),
                            dtype=torch.float32, requires_grad=True)  # fmt: skip
        labels = torch.tensor(rng.integers(0, v - 1, (b, u)))  # NeMo ids; blank = v - 1
        act_lens = torch.tensor([t] + [t - 1 - i for i in range(b - 1)])
        label_lens = torch.tensor([u] + [max(u - 1 - i, 0) for i in range(b - 1)])
        loss_fn = TDTLossPytorch(blank=v - 1, durations=durations, reduction=None, sigma=sigma)
        losses = loss_fn(acts=acts, labels=labels, act_lens=act_lens, label_lens=label_lens)
        losses.sum().backward()
        arrays.update({
            f"{name}/acts": acts.detach().numpy(), f"{name}/labels": labels.numpy(),
            f"{name}/act_lens": act_lens.numpy(), f"{name}/label_lens": label_lens.numpy(),
            f"{name}/durations": np.array(durations), f"{name}/sigma": np.array(sigma),
            f"{name}/losses": losses.detach().numpy(), f"{name}/grad": acts.grad.numpy(),
        })  # fmt: skip
    np.savez_compressed(out / "tdt_losses.npz", **arrays)


STEP_KINDS = {
    # name: encoder options, TDT, the top-level and loss settings of the NeMo config
    "conformer_rnnt": (dict(subsampling="striding", subsampling_factor=4, xscaling=True), False,
                       {"rnnt_reduction": "mean_batch",
                        "loss": {"loss_name": "warprnnt_numba",
                                 "warprnnt_numba_kwargs": {"fastemit_lambda": 5e-3}}}),
    "fastconformer_tdt": (dict(subsampling="dw_striding", subsampling_factor=8, xscaling=False),
                          True, {"rnnt_reduction": "mean_volume"}),
    "hybrid_tdt_ctc": (dict(subsampling="dw_striding", subsampling_factor=8, xscaling=False),
                       True, {"rnnt_reduction": "mean_batch",
                              "aux_ctc": {"ctc_loss_weight": 0.3, "ctc_reduction": "mean_batch"}}),
    # NeMo's hybrid reductions as its configs ship them: each loss divided by its own count
    "hybrid_rnnt_mixed": (dict(subsampling="dw_striding", subsampling_factor=8, xscaling=False),
                          False, {"rnnt_reduction": "mean_volume",
                                  "aux_ctc": {"ctc_loss_weight": 0.3,
                                              "ctc_reduction": "mean_batch"}}),
}  # fmt: skip
STEP_SAMPLES, STEP_TOKENS = 4 * 16000, 16  # per clip, at most (the tokens: 16, 15, ...)
STEP_OPTIM = {"name": "adamw", "lr": 1e-3, "betas": [0.9, 0.98], "weight_decay": 1e-3}
SPEC_AUGMENT = {
    "_target_": "nemo.collections.asr.modules.SpectrogramAugmentation",
    "freq_masks": 2,
    "freq_width": 27,
    "time_masks": 10,
    "time_width": 0.05,
}


def _step_config(tokenizer: Path, name: str) -> dict:
    """A tiny model with a published template's training settings (dropout rates,
    SpecAugment, optimizer, the kind's loss settings)."""
    encoder, tdt, settings = STEP_KINDS[name]
    config = _model_config(tokenizer, "tdt" if tdt else "rnnt")
    config["encoder"].update(encoder, d_model=16, n_heads=2, n_layers=1, conv_kernel_size=5,
                             subsampling_conv_channels=8, dropout=0.1, dropout_att=0.05,
                             dropout_pre_encoder=0.1)  # fmt: skip
    config["decoder"]["prednet"].update(pred_hidden=16, pred_rnn_layers=1, dropout=0.2)
    config["joint"]["jointnet"].update(joint_hidden=24, dropout=0.2)
    config["model_defaults"] = {"enc_hidden": 16, "pred_hidden": 16}
    config["preprocessor"]["dither"] = 0.0
    config.update(spec_augment=SPEC_AUGMENT, optim=STEP_OPTIM)
    settings = json.loads(json.dumps(settings))
    if tdt:
        config["loss"]["tdt_kwargs"].update(omega=0.0)  # the reference loss has no omega
    config.update({k: v for k, v in settings.items() if k != "loss"})
    config.setdefault("loss", {}).update(settings.get("loss", {}))
    if "aux_ctc" in config:
        config["aux_ctc"].update(
            decoder={"_target_": "nemo.collections.asr.modules.ConvASRDecoder", "feat_in": 16,
                     "num_classes": -1, "vocabulary": []},
            decoding={"strategy": "greedy"},
        )  # fmt: skip
    return config


def _nemo_step(model, signal, lengths, targets, target_lengths):
    """NeMo's training_step on one batch: (loss, {parameter name: gradient})."""
    import torch

    model.zero_grad()
    out = model.training_step((signal, lengths, targets, target_lengths), 0)
    out["loss"].backward()
    grads = {n: p.grad.detach().clone() if p.grad is not None else torch.zeros_like(p)
             for n, p in model.named_parameters()}  # fmt: skip
    return float(out["loss"]), grads


def steps(out: Path) -> None:
    import types

    import numpy as np
    import torch
    from nemo.collections.asr.losses.rnnt_pytorch import TDTLossPytorch
    from nemo.collections.asr.models import EncDecHybridRNNTCTCBPEModel, EncDecRNNTBPEModel
    from omegaconf import OmegaConf

    torch.Tensor.cuda = lambda self, *args, **kwargs: self  # the TDT reference runs on CPU
    tokenizer = _tokenizer(out)
    lengths, batch = _clip_batch()
    # The clips' first seconds and their transcripts' first tokens: a gradient is a
    # gradient whatever the text, and NeMo's reference TDT loss loops in Python.
    lengths = np.minimum(lengths, STEP_SAMPLES)
    batch = np.ascontiguousarray(batch[:, : lengths.max()])
    lines = [line.split(" ", 1)[1].lower() for line in TEXTS.read_text().splitlines()]
    arrays, summary = {}, {"clips": [str(p.relative_to(ROOT)) for p in CLIPS], "micro": 2}
    for name in STEP_KINDS:
        torch.manual_seed(5)
        config = OmegaConf.create(_step_config(tokenizer, name))
        cls = EncDecHybridRNNTCTCBPEModel if "aux_ctc" in config else EncDecRNNTBPEModel
        model = cls(cfg=config)
        _randomise_statistics(model)
        tokens = [model.tokenizer.text_to_ids(t)[: STEP_TOKENS - i] for i, t in enumerate(lines)]
        targets, target_lengths = _padded(tokens)
        if "aux_ctc" in config:
            _fit_ctc(model, batch, lengths, targets, target_lengths)
        model.save_to(str(out / f"step_{name}.nemo"))
        model = cls.restore_from(str(out / f"step_{name}.nemo"), map_location="cpu")
        if config.model_defaults.get("tdt_durations") or "tdt_kwargs" in config.loss:
            kwargs = config.loss.tdt_kwargs
            model.loss._loss = TDTLossPytorch(blank=model.tokenizer.vocab_size,
                                              durations=list(kwargs.durations),
                                              reduction=None, sigma=kwargs.sigma)  # fmt: skip
        model.spec_augmentation = None
        model.train()
        for module in model.modules():  # as asrkit fine-tunes: frozen BatchNorm, no dropout
            if isinstance(module, torch.nn.BatchNorm1d | torch.nn.Dropout):
                module.eval()
        optimizer = torch.optim.AdamW(model.parameters(), lr=STEP_OPTIM["lr"],
                                      betas=tuple(STEP_OPTIM["betas"]),
                                      weight_decay=STEP_OPTIM["weight_decay"])  # fmt: skip
        model._optimizer = optimizer
        # No Lightning trainer: training_step reads two of its fields and logs (a no-op here).
        model._trainer = types.SimpleNamespace(global_step=0, log_every_n_steps=10**9)
        model.log_dict = model.log = lambda *args, **kwargs: None
        signal, sig_lengths = torch.from_numpy(batch), torch.from_numpy(lengths)
        tgt, tgt_lengths = torch.from_numpy(targets), torch.from_numpy(target_lengths)
        with torch.no_grad():
            feats, feat_lengths = model.preprocessor(input_signal=signal, length=sig_lengths)
        ctc = {}  # the hybrid's CTC greedy search, on the weights before the update
        if "aux_ctc" in config:
            model.eval()
            with torch.no_grad():
                encoded, encoded_lengths = model.encoder(audio_signal=feats, length=feat_lengths)
                log_probs = model.ctc_decoder(encoder_output=encoded)
                hyps = model.ctc_decoding.ctc_decoder_predictions_tensor(
                    log_probs, decoder_lengths=encoded_lengths, return_hypotheses=True
                )
            hyps = hyps[0] if isinstance(hyps, tuple) else hyps
            # y_sequence: the best symbol of every frame (NeMo ids, blank last); text: the
            # hypothesis NeMo makes of them.
            ctc["ctc_frames"] = [torch.as_tensor(h.y_sequence).tolist() for h in hyps]
            ctc["ctc_text"] = [h.text for h in hyps]
            model.train()
            for module in model.modules():
                if isinstance(module, torch.nn.BatchNorm1d | torch.nn.Dropout):
                    module.eval()
        loss, grads = _nemo_step(model, signal, sig_lengths, tgt, tgt_lengths)
        # NeMo's own accumulation over two micro-batches: the mean of their means.
        half = len(lengths) // 2
        parts = [slice(0, half), slice(half, len(lengths))]
        accumulated = {n: torch.zeros_like(g) for n, g in grads.items()}
        for part in parts:
            u = int(target_lengths[part].max())
            _, part_grads = _nemo_step(
                model,
                signal[part, : int(lengths[part].max())],
                sig_lengths[part],
                tgt[part, :u],
                tgt_lengths[part],
            )
            for n, g in part_grads.items():
                accumulated[n] += g / len(parts)
        for n, p in model.named_parameters():
            p.grad = grads[n].clone()
        before = {n: p.detach().clone() for n, p in model.named_parameters()}
        optimizer.step()
        # The same preprocessor settings in every kind: one copy of the features.
        arrays.update(
            {
                "features": feats.numpy(),
                "feature_lengths": feat_lengths.numpy(),
                f"{name}/targets": targets,
                f"{name}/target_lengths": target_lengths,
            }
        )
        for n, p in model.named_parameters():
            arrays[f"{name}/grad/{n}"] = grads[n].numpy()
            arrays[f"{name}/accumulated/{n}"] = accumulated[n].numpy()
            arrays[f"{name}/update/{n}"] = (p.detach() - before[n]).numpy()
        summary[name] = {"loss": loss, "split": half, **ctc}
    shutil.rmtree(tokenizer)
    arrays.update(_fastemit_losses())
    np.savez_compressed(out / "steps.npz", **arrays)
    (out / "steps.json").write_text(json.dumps(summary, indent=1) + "\n")


def _fit_ctc(model, batch, lengths, targets, target_lengths, steps: int = 120) -> None:
    """The hybrid's encoder and CTC head trained with the CTC loss for a CPU minute: a
    random encoder gives nearly the same frame everywhere; trained, its CTC greedy search
    emits varied tokens with clear margins."""
    import torch

    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    signal, sig_lengths = torch.from_numpy(batch), torch.from_numpy(lengths)
    tgt, tgt_lengths = torch.from_numpy(targets), torch.from_numpy(target_lengths)
    model.train()
    for step in range(steps):
        feats, feat_lengths = model.preprocessor(input_signal=signal.clone(), length=sig_lengths)
        encoded, encoded_lengths = model.encoder(audio_signal=feats, length=feat_lengths)
        log_probs = model.ctc_decoder(encoder_output=encoded)
        blank = model.tokenizer.vocab_size
        loss = torch.nn.functional.ctc_loss(log_probs.transpose(0, 1), tgt, encoded_lengths,
                                            tgt_lengths, blank=blank)  # fmt: skip
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if step % 20 == 0:
            print(f"  step {step}: ctc {float(loss):.3f}", flush=True)
    model.eval()


FASTEMIT = 0.01


def _fastemit_losses() -> dict:
    """NeMo's CPU (numba) RNN-T loss with FastEmit on random logits: per-utterance losses
    and the gradient of their sum (blank last)."""
    import numpy as np
    import torch
    from nemo.collections.asr.losses.rnnt import RNNTLoss

    rng = np.random.default_rng(11)
    b, t, u, v = 3, 7, 4, 6
    acts = torch.tensor(rng.standard_normal((b, t, u + 1, v)), dtype=torch.float32,
                        requires_grad=True)  # fmt: skip
    labels = torch.tensor(rng.integers(0, v - 1, (b, u)))
    act_lens, label_lens = torch.tensor([7, 5, 3]), torch.tensor([4, 2, 0])
    loss_fn = RNNTLoss(num_classes=v - 1, reduction=None, loss_name="warprnnt_numba",
                       loss_kwargs={"fastemit_lambda": FASTEMIT})  # fmt: skip
    log_probs = acts.log_softmax(-1)  # as NeMo's joint gives them on CPU
    losses = loss_fn(log_probs=log_probs, targets=labels, input_lengths=act_lens,
                     target_lengths=label_lens)  # fmt: skip
    losses.sum().backward()
    return {"fastemit/acts": acts.detach().numpy(), "fastemit/labels": labels.numpy(),
            "fastemit/act_lens": act_lens.numpy(), "fastemit/label_lens": label_lens.numpy(),
            "fastemit/lambda": np.array(FASTEMIT), "fastemit/losses": losses.detach().numpy(),
            "fastemit/grad": acts.grad.numpy()}  # fmt: skip


STREAMING_CONTEXTS = [[16, 3], [16, 7], [16, 1], [16, 0]]  # NeMo's att_context_size list


def streaming(out: Path) -> None:
    """A tiny cache-aware streaming FastConformer-Transducer of the published kind (causal
    dw_striding x8, chunked_limited attention with several look-aheads, causal LayerNorm
    convolutions, unnormalised features), trained a few CPU minutes with NeMo's multi
    look-ahead training, then per look-ahead on each clip alone: the features, the offline
    encoder frames and greedy tokens, and NeMo's cache-aware streaming loop
    (CacheAwareStreamingAudioBuffer + conformer_stream_step): every chunk's encoder frames
    and the streamed greedy tokens."""
    import numpy as np
    import soundfile
    import torch
    from nemo.collections.asr.models import EncDecRNNTBPEModel
    from nemo.collections.asr.parts.utils.streaming_utils import CacheAwareStreamingAudioBuffer
    from omegaconf import OmegaConf

    tokenizer = _tokenizer(out)
    lengths, batch = _clip_batch()
    lines = [line.split(" ", 1)[1].lower() for line in TEXTS.read_text().splitlines()]
    config = _model_config(tokenizer, "tdt")
    config["preprocessor"]["normalize"] = "NA"
    config["encoder"].update(
        xscaling=True, causal_downsampling=True, att_context_style="chunked_limited",
        att_context_size=STREAMING_CONTEXTS, conv_context_size="causal",
        conv_norm_type="layer_norm",
    )  # fmt: skip
    config.pop("loss", None)
    config["joint"].pop("num_extra_outputs", None)
    config["decoding"] = {"strategy": "greedy_batch", "greedy": {"max_symbols": 5}}
    torch.manual_seed(5)
    model = EncDecRNNTBPEModel(cfg=OmegaConf.create(config))
    _randomise_statistics(model)
    targets, target_lengths = _padded([model.tokenizer.text_to_ids(t) for t in lines])
    _overfit(model, torch.from_numpy(batch), torch.from_numpy(lengths),
             torch.from_numpy(targets), torch.from_numpy(target_lengths), steps=300)  # fmt: skip
    model.save_to(str(out / "streaming.nemo"))
    shutil.rmtree(tokenizer)
    model = EncDecRNNTBPEModel.restore_from(str(out / "streaming.nemo"), map_location="cpu")
    model.eval()
    arrays, summary = {}, {"clips": [str(p.relative_to(ROOT)) for p in CLIPS],
                           "contexts": STREAMING_CONTEXTS}  # fmt: skip
    for context in STREAMING_CONTEXTS:
        key = f"{context[0]}_{context[1]}"
        model.encoder.set_default_att_context_size(context)
        cfg = model.encoder.streaming_cfg
        found = summary[key] = {"offline": [], "streaming": [], "chunk_frames": [],
                                "chunk_size": cfg.chunk_size, "shift_size": cfg.shift_size,
                                "pre_encode_cache_size": cfg.pre_encode_cache_size,
                                "drop_extra_pre_encoded": cfg.drop_extra_pre_encoded}  # fmt: skip
        for index, clip in enumerate(CLIPS):
            wave = soundfile.read(clip, dtype="float32")[0]
            with torch.no_grad():
                feats, feat_lengths = model.preprocessor(
                    input_signal=torch.from_numpy(wave)[None], length=torch.tensor([len(wave)])
                )
                encoded, encoded_lengths = model.encoder(audio_signal=feats, length=feat_lengths)
                hyps = model.decoding.rnnt_decoder_predictions_tensor(
                    encoder_output=encoded, encoded_lengths=encoded_lengths,
                    return_hypotheses=True,
                )  # fmt: skip
            # [T, mel]: the whole tensor, whose last frame (past the valid length) NeMo's
            # streaming buffer passes on as a frame of zeros
            arrays[f"features/{index}"] = feats[0].T.numpy()
            arrays[f"feature_lengths/{index}"] = feat_lengths.numpy()
            arrays[f"{key}/offline/{index}"] = encoded[0, :, : int(encoded_lengths[0])].T.numpy()
            found["offline"].append([int(t) for t in hyps[0].y_sequence])
            chunks, tokens = _nemo_stream(model, wave, CacheAwareStreamingAudioBuffer)
            arrays[f"{key}/streaming/{index}"] = np.concatenate(chunks, axis=0)
            found["chunk_frames"].append([len(c) for c in chunks])
            found["streaming"].append(tokens)
    np.savez_compressed(out / "streaming.npz", **arrays)
    (out / "streaming.json").write_text(json.dumps(summary, indent=1) + "\n")


def _nemo_stream(model, wave, buffer_class):
    """NeMo's cache-aware streaming of one waveform, as its streaming example runs it: each
    chunk's encoder frames [n, D] (the encoder's cache-aware step) and the greedy tokens of
    conformer_stream_step's loop."""
    import torch

    def loop(step):
        buffer = buffer_class(model=model)
        buffer.append_audio(wave)
        caches = model.encoder.get_initial_cache_state(batch_size=1)
        carried = None
        for number, (chunk, chunk_lengths) in enumerate(iter(buffer)):
            drop = 0 if number == 0 else model.encoder.streaming_cfg.drop_extra_pre_encoded
            with torch.no_grad():
                caches, carried = step(chunk, chunk_lengths, caches, carried, drop,
                                       buffer.is_buffer_empty())  # fmt: skip
        return carried

    def encoder_step(chunk, chunk_lengths, caches, carried, drop, last):
        encoded, lengths, *caches = model.encoder.cache_aware_stream_step(
            processed_signal=chunk, processed_signal_length=chunk_lengths,
            cache_last_channel=caches[0], cache_last_time=caches[1],
            cache_last_channel_len=caches[2], keep_all_outputs=last,
            drop_extra_pre_encoded=drop,
        )  # fmt: skip
        return caches, (carried or []) + [encoded[0, :, : int(lengths[0])].T.numpy()]

    def model_step(chunk, chunk_lengths, caches, carried, drop, last):
        _, _, *rest = model.conformer_stream_step(
            processed_signal=chunk, processed_signal_length=chunk_lengths,
            cache_last_channel=caches[0], cache_last_time=caches[1],
            cache_last_channel_len=caches[2], keep_all_outputs=last,
            previous_hypotheses=carried, drop_extra_pre_encoded=drop,
            return_transcription=True,
        )  # fmt: skip
        return rest[:3], rest[3]

    chunks = loop(encoder_step)
    hypotheses = loop(model_step)
    return chunks, [int(t) for t in hypotheses[0].y_sequence]


def restore_with_adapter_encoder(path: str):
    """A `.nemo` RNN-T restored with its encoder as NeMo's adapter-capable class (what
    `add_adapter` on the encoder needs)."""
    from nemo.collections.asr.models import EncDecRNNTBPEModel
    from nemo.core import adapter_mixins
    from omegaconf import open_dict

    cfg = EncDecRNNTBPEModel.restore_from(path, return_config=True, map_location="cpu")
    with open_dict(cfg):
        cfg.encoder._target_ = adapter_mixins.get_registered_adapter(
            cfg.encoder._target_).adapter_class_path  # fmt: skip
    return EncDecRNNTBPEModel.restore_from(path, override_config_path=cfg, map_location="cpu")


def adapters(out: Path) -> None:
    """The committed `rnnt.nemo` with NeMo's linear adapters (`adapters.nemo`): restored
    with its encoder as NeMo's ConformerEncoderAdapter, a LinearAdapter `ft` of 8 units
    added on the encoder (every block, "post"), its weights randomised (a zero output
    layer would hide it), a second adapter `off` added and left disabled; saved, restored,
    and NeMo's encoder frames and greedy tokens on the clips written to `adapters.npz` /
    `adapters.json`."""
    import numpy as np
    import torch
    from nemo.collections.asr.models import EncDecRNNTBPEModel
    from nemo.collections.common.parts.adapter_modules import LinearAdapterConfig

    model = restore_with_adapter_encoder(str(out / "rnnt.nemo"))
    d_model = model.cfg.encoder.d_model
    model.add_adapter(name="encoder:ft", cfg=LinearAdapterConfig(in_features=d_model, dim=8))
    model.add_adapter(name="encoder:off", cfg=LinearAdapterConfig(in_features=d_model, dim=4))
    torch.manual_seed(5)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if ".adapter_layer." in name:
                parameter.normal_(1.0 if name.endswith("module.0.weight") else 0.0, 0.3)
    model.set_enabled_adapters(enabled=False)
    model.set_enabled_adapters(name="encoder:ft", enabled=True)
    model.save_to(str(out / "adapters.nemo"))
    model = EncDecRNNTBPEModel.restore_from(str(out / "adapters.nemo"), map_location="cpu")
    model.eval()
    assert model.get_enabled_adapters() == ["ft"], model.get_enabled_adapters()
    lengths, batch = _clip_batch()
    feats, feat_lengths, encoded, encoded_lengths, hyps = _nemo_search(model, batch, lengths)
    with torch.no_grad():
        model.set_enabled_adapters(enabled=False)
        plain, _ = model.encoder(audio_signal=feats, length=feat_lengths)
    assert float((plain - encoded).abs().max()) > 1e-2  # the adapter changes the frames
    np.savez_compressed(out / "adapters.npz", encoded=encoded.numpy(),
                        encoded_lengths=encoded_lengths.numpy())  # fmt: skip
    (out / "adapters.json").write_text(json.dumps({
        "clips": [str(p.relative_to(ROOT)) for p in CLIPS],
        "greedy": [[int(t) for t in h.y_sequence] for h in hyps],
    }, indent=1) + "\n")  # fmt: skip


def batch_norm(out: Path) -> None:
    """NeMo's default fine-tuning step, BatchNorm in train mode (`batch_norm.npz`): the
    committed `step_conformer_rnnt.nemo` on the steps' batch and targets, dropout and
    SpecAugment off, every BatchNorm from the batch's statistics; the loss, each
    parameter's gradient, and the BatchNorm running statistics after that step."""
    import types

    import numpy as np
    import torch
    from nemo.collections.asr.models import EncDecRNNTBPEModel

    name = "conformer_rnnt"
    steps_npz = np.load(out / "steps.npz")
    targets = steps_npz[f"{name}/targets"]
    target_lengths = steps_npz[f"{name}/target_lengths"]
    lengths, batch = _clip_batch()
    lengths = np.minimum(lengths, STEP_SAMPLES)
    batch = np.ascontiguousarray(batch[:, : lengths.max()])
    model = EncDecRNNTBPEModel.restore_from(str(out / f"step_{name}.nemo"), map_location="cpu")
    model.spec_augmentation = None
    model.train()
    norms = {}
    for module_name, module in model.named_modules():
        if isinstance(module, torch.nn.Dropout):
            module.eval()
        if isinstance(module, torch.nn.BatchNorm1d):
            norms[module_name] = module
    assert norms and all(m.training for m in norms.values())
    model._optimizer = torch.optim.SGD(model.parameters(), lr=0.0)  # training_step logs its lr
    model._trainer = types.SimpleNamespace(global_step=0, log_every_n_steps=10**9)
    model.log_dict = model.log = lambda *args, **kwargs: None
    loss, grads = _nemo_step(
        model, torch.from_numpy(batch), torch.from_numpy(lengths),
        torch.from_numpy(targets), torch.from_numpy(target_lengths),
    )  # fmt: skip
    arrays = {f"grad/{n}": g.numpy() for n, g in grads.items()}
    for module_name, module in norms.items():
        arrays[f"running_mean/{module_name}"] = module.running_mean.numpy()
        arrays[f"running_var/{module_name}"] = module.running_var.numpy()
        arrays[f"momentum/{module_name}"] = np.array(module.momentum)
    arrays["loss"] = np.array(loss)
    np.savez_compressed(out / "batch_norm.npz", **arrays)


def tarred(out: Path) -> None:
    import shutil
    import subprocess
    import sys
    import tempfile

    if NEMO_REPO is None:
        raise SystemExit("--parts tarred needs --nemo-repo (a NeMo checkout: its scripts/)")
    script = NEMO_REPO / "scripts/speech_recognition/convert_to_tarred_audio_dataset.py"
    texts = {}
    for listing in (ROOT / "tests/data/realspeech/test-real").rglob("*.trans.txt"):
        for line in listing.read_text().splitlines():
            name, _, text = line.partition(" ")
            texts[name] = text.lower()
    clips = CLIPS[:3]
    target = out / "tarred"
    shutil.rmtree(target, ignore_errors=True)
    with tempfile.TemporaryDirectory() as tmp:
        import soundfile

        (Path(tmp) / "audio").mkdir()
        entries = []
        for clip in clips:
            shutil.copy(clip, Path(tmp) / "audio" / clip.name)
            entries.append({"audio_filepath": f"audio/{clip.name}",
                            "duration": soundfile.info(str(clip)).duration,
                            "text": texts[clip.stem]})  # fmt: skip
        entries.append({"audio_filepath": f"audio/{clips[0].name}", "duration": 0.8,
                        "offset": 0.5, "text": "a segment"})  # fmt: skip
        manifest = Path(tmp) / "manifest.json"
        manifest.write_text("".join(json.dumps(e) + "\n" for e in entries))
        subprocess.run(
            [sys.executable, str(script), f"--manifest_path={manifest}",
             f"--target_dir={target.resolve()}", "--num_shards=2", "--max_duration=40",
             "--min_duration=0.1", "--sort_in_shards", "--force_codec=flac", "--workers=1",
             "--dynamic_buckets_num=2"],
            cwd=tmp, check=True, stdout=subprocess.DEVNULL,
        )  # fmt: skip


NEMO_REPO: Path | None = None

PARTS = {"features": features, "attention": attention, "encoders": encoders, "models": models,
         "beams": beams, "tdt_losses": tdt_losses, "steps": steps,
         "streaming": streaming, "adapters": adapters,
         "batch_norm": batch_norm, "tarred": tarred}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "tests/data/nemo")
    parser.add_argument(
        "--parts", nargs="+", choices=sorted(PARTS), default=list(PARTS),
        help="which fixtures to write (beams reads the committed archives)",
    )  # fmt: skip
    parser.add_argument("--nemo-repo", type=Path,
                        help="a NeMo checkout (for --parts tarred: NeMo's own script)")  # fmt: skip
    args = parser.parse_args()
    global NEMO_REPO
    NEMO_REPO = args.nemo_repo
    args.out.mkdir(parents=True, exist_ok=True)
    for part in args.parts:
        PARTS[part](args.out)
    print(f"wrote {sorted(p.name for p in args.out.iterdir())}")


if __name__ == "__main__":
    main()
