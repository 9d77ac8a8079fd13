"""Data: manifests (JSONL), corpus preparation, and (later) TFRecord shards and tf.data input."""
