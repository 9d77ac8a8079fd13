"""SavedModel export: a waveform in, its transcript out, everything inside one graph.

The serving signature takes a mono float32 waveform at the model's sample rate (16 kHz by
default), any length, and returns {"text": string, "tokens": int32 [N], "score": float32}.
Features (log-mel + the training set's mean/variance), the encoder, the search (greedy by
default, or beam search) and detokenisation are all TensorFlow ops, so
`tf.saved_model.load(dir)` serves it with TensorFlow alone — asrkit need not be installed.
"""

from __future__ import annotations

import json
from pathlib import Path

import keras
import tensorflow as tf

from asrkit import __version__
from asrkit.decoding.search import DecodeOptions, describe, search
from asrkit.experiment import load_experiment
from asrkit.features import MIN_FEATURE_FRAMES, log_mel


def export_model(
    exp_dir: str | Path,
    out: str | Path,
    checkpoint: str | None = None,
    average: int = 1,
    options: DecodeOptions | None = None,
) -> Path:
    """Writes the SavedModel of an experiment's checkpoint (or the average of its last
    `average` checkpoints) to `out`, with an `asrkit_export.json` describing it. `options`:
    the search built into the graph (default: greedy with the experiment's symbols limit)."""
    experiment = load_experiment(exp_dir, checkpoint, average)
    model, config, tokenizer = experiment.network, experiment.config, experiment.tokenizer
    options = options or DecodeOptions(max_symbols_per_step=config.decode.max_symbols_per_step)
    normalizer = experiment.normalizer
    features = config.features
    pieces = tf.constant(tokenizer.surface_pieces())
    mean = tf.constant(normalizer.mean if normalizer else 0.0, tf.float32)
    std = tf.constant(normalizer.std if normalizer else 1.0, tf.float32)

    def transcribe(waveform):
        feats = (log_mel(waveform, features) - mean) / std  # [T, F]
        length = tf.shape(feats)[0]
        feats = tf.pad(feats, [[0, tf.maximum(MIN_FEATURE_FRAMES - length, 0)], [0, 0]])
        encoded, lengths = model.encode(feats[None], length[None], training=False)
        tokens, _, counts, scores = search(model, encoded, lengths, options)
        ids = tokens[0, : counts[0]]
        text = tf.strings.reduce_join(tf.gather(pieces, ids))
        text = tf.strings.strip(tf.strings.regex_replace(text, " +", " "))
        return {"text": tf.strings.upper(text), "tokens": ids, "score": scores[0]}

    out = Path(out)
    archive = keras.export.ExportArchive()
    archive.track(model)
    archive.add_endpoint(
        "serve", transcribe, input_signature=[tf.TensorSpec([None], tf.float32, name="waveform")]
    )
    archive.write_out(str(out), verbose=False)
    info = {
        "asrkit_version": __version__,
        "sample_rate": features.sample_rate,
        "input": "mono float32 waveform in [-1, 1], any length",
        "outputs": {"text": "string", "tokens": "int32 [N]", "score": "float32"},
        "decoding": describe(options),
        "vocab_size": tokenizer.vocab_size,
        "experiment": str(Path(exp_dir).resolve()),
    }
    (out / "asrkit_export.json").write_text(json.dumps(info, indent=2) + "\n")
    return out
