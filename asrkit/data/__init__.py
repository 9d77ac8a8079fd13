"""Data: manifests (JSONL), corpus preparation (LibriSpeech layout, the synthetic TTS corpus),
TFRecord shards with their fingerprints, and the bucketed tf.data input pipeline."""
