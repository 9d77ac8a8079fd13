"""What a search returns, as graph tensors (shared by greedy and beam search)."""

from __future__ import annotations

from typing import NamedTuple

import tensorflow as tf


class Found(NamedTuple):
    """What a search found, as graph tensors; greedy: one per row ([B, ...]), beam search:
    K per row, best first ([B, K, ...]). Token slots past `counts` hold -1 (log-probs 0)."""

    tokens: tf.Tensor  # int32 [..., N]
    frames: tf.Tensor  # int32 [..., N]: the encoder frame each token was emitted at
    token_log_probs: tf.Tensor  # float32 [..., N]: log-posterior of each token where emitted
    counts: tf.Tensor  # int32 [...]
    scores: tf.Tensor  # float32 [...]: log-probability of the hypothesis
