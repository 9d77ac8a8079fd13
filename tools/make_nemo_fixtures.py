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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "tests/data/nemo")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    features(args.out)
    attention(args.out)
    print(f"wrote {sorted(p.name for p in args.out.iterdir())}")


if __name__ == "__main__":
    main()
