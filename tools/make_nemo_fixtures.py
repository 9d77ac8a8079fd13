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
"""

from __future__ import annotations

import argparse
import json
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


def features(out: Path) -> None:
    import numpy as np
    import soundfile
    import torch
    from nemo.collections.asr.modules import AudioToMelSpectrogramPreprocessor

    waves = [soundfile.read(p, dtype="float32")[0] for p in CLIPS]
    lengths = np.array([len(w) for w in waves])
    batch = np.zeros((len(waves), lengths.max()), np.float32)
    for i, w in enumerate(waves):
        batch[i, : len(w)] = w
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "tests/data/nemo")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    features(args.out)
    attention(args.out)
    encoders(args.out)
    print(f"wrote {sorted(p.name for p in args.out.iterdir())}")


if __name__ == "__main__":
    main()
