"""Shards of random features whose labels encode their utterance, with the side files
(`*.lengths.json`) that `asrkit features extract` writes beside each."""

import json

import numpy as np
import tensorflow as tf

from asrkit.data.records import serialize_example


def fake_shards(tmp_path, n=60, seed=0):
    """Utterances of random length with labels that encode their id and length."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(40, 400, size=n)
    paths = [tmp_path / f"s{i}.tfrecord" for i in range(3)]
    writers = [tf.io.TFRecordWriter(str(p)) for p in paths]
    counts = [{"frames": [], "tokens": []} for _ in paths]
    for i, length in enumerate(lengths):
        feats = rng.standard_normal((length, 80)).astype(np.float32) + 5.0  # never 0
        labels = [1 + (i % 7)] * int(rng.integers(1, 8))
        writers[i % 3].write(serialize_example(f"u{i:03d}", feats, labels, length / 100))
        counts[i % 3]["frames"].append(int(length))
        counts[i % 3]["tokens"].append(len(labels))
    for w, path, c in zip(writers, paths, counts, strict=True):
        w.close()
        path.with_suffix(".lengths.json").write_text(json.dumps(c))
    return [str(p) for p in paths], lengths
