"""How close an imported NeMo model is to NeMo itself, on the committed fixtures.

For each fixture model (`tests/data/nemo/{rnnt,tdt}.nemo`, made by
`tools/make_nemo_fixtures.py` with NeMo 3.0): imports it, computes asrkit's features from
the audio of the real clips, and prints the largest differences from NeMo's own outputs —
encoder frames, predictor states, joint log-probs (at NeMo's sampled cells), per-utterance
RNN-T losses — and how many clips' greedy tokens and frames are identical.

    python tools/nemo_parity.py
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "tests/data/nemo"


def main() -> None:
    import argparse

    argparse.ArgumentParser(description=__doc__.splitlines()[0]).parse_args()
    import numpy as np
    import tensorflow as tf

    sys.path.insert(0, str(ROOT))
    from asrkit.audio import read_audio
    from asrkit.decoding.search import DecodeOptions, decode_batch
    from asrkit.experiment import load_experiment
    from asrkit.features import log_mel
    from asrkit.importers.nemo_model import import_nemo
    from asrkit.losses import fused_rnnt_loss

    meta = json.loads((DATA / "models.json").read_text())
    arrays = np.load(DATA / "models.npz")
    print("model | encoder | predictor | joint log-probs | RNN-T loss (rel.) | greedy equal")
    for name in ("rnnt", "tdt"):
        with tempfile.TemporaryDirectory() as tmp:
            import_nemo(DATA / f"{name}.nemo", Path(tmp) / "exp")
            experiment = load_experiment(Path(tmp) / "exp")
        net = experiment.network
        feats = [log_mel(read_audio(ROOT / c, 16000), experiment.config.features).numpy()
                 for c in meta["clips"]]  # fmt: skip
        lengths = np.array([len(f) for f in feats], np.int32)
        batch = np.zeros((len(feats), lengths.max(), feats[0].shape[1]), np.float32)
        for i, f in enumerate(feats):
            batch[i, : len(f)] = f
        encoded, encoded_lengths = net.encode(batch, lengths)
        want = arrays[f"{name}/encoded"].transpose(0, 2, 1)
        n = arrays[f"{name}/encoded_lengths"]
        enc = max(
            float(np.abs(encoded.numpy()[i, :k] - want[i, :k]).max()) for i, k in enumerate(n)
        )
        targets, target_lengths = arrays[f"{name}/targets"], arrays[f"{name}/target_lengths"]
        valid = np.arange(targets.shape[1])[None] < target_lengths[:, None]
        labels = np.where(valid, targets + 1, 0).astype(np.int32)
        predicted = net.predict_labels(tf.constant(labels)).numpy()
        want_pred = arrays[f"{name}/predicted"].transpose(0, 2, 1)
        pred = max(float(np.abs(predicted[i, : u + 1] - want_pred[i, : u + 1]).max())
                   for i, u in enumerate(target_lengths))  # fmt: skip
        at = arrays[f"{name}/joint_at"]
        e_at, p_at = tf.gather_nd(encoded, at[:, :2]), tf.gather_nd(predicted, at[:, [0, 2]])
        logits = net.joint(e_at, p_at).numpy()
        mine = [logits[:, 1:], logits[:, :1]]
        if net.joint.durations:
            mine.append(net.joint.duration_logits(e_at, p_at).numpy())
        mine = tf.nn.log_softmax(np.concatenate(mine, axis=1)).numpy()
        joint = float(np.abs(mine - arrays[f"{name}/joint"]).max())
        enc_h, pred_h = net.joint.project(encoded, tf.constant(predicted))
        out = net.joint.output_layer
        losses = fused_rnnt_loss(enc_h, pred_h, labels, encoded_lengths, target_lengths,
                                 kernel=out.kernel, bias=out.bias,
                                 activation=net.joint.activation).numpy()  # fmt: skip
        nemo_losses = arrays[f"{name}/rnnt_losses"]
        loss = float(np.max(np.abs(losses - nemo_losses) / np.abs(nemo_losses)))
        options = DecodeOptions(max_symbols_per_step=experiment.config.decode.max_symbols_per_step)
        hyps = decode_batch(net, batch, lengths, experiment.tokenizer, options)
        same = sum(
            [t - 1 for t in h.tokens] == meta[name]["greedy"][i]
            and h.frames == meta[name]["frames"][i]
            for i, h in enumerate(hyps)
        )
        tokens = sum(len(h.tokens) for h in hyps)
        print(f"{name} | {enc:.1e} | {pred:.1e} | {joint:.1e} | {loss:.1e} | "
              f"{same}/{len(hyps)} clips ({tokens} tokens)")  # fmt: skip


if __name__ == "__main__":
    main()
