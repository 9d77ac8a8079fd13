"""The training *task* around a transducer network: the RNN-T loss and the accumulation
engine (keras-hub's Task around a Backbone).

`compute_loss_terms` returns (Σ per-utterance RNN-T losses, count) with the count set by
`model.normalize_by`: tokens (Σ label_lengths) or utterances. `fit` on the task is the
user's training API; `task.network` is what decoding, export and fine-tuning use.
"""

from __future__ import annotations

import keras
import tensorflow as tf

from asrkit.losses import rnnt_loss
from asrkit.models.transducer import Transducer
from asrkit.tokenizer import BLANK_ID
from asrkit.training.accumulation import AccumulatingModel


@keras.saving.register_keras_serializable(package="asrkit")
class TransducerTask(AccumulatingModel):
    def __init__(self, network: Transducer | dict, **kwargs):
        super().__init__(**kwargs)
        if isinstance(network, dict):
            network = keras.saving.deserialize_keras_object(network)
        self.network = network

    def call(self, batch, training=False):
        return self.network(batch, training=training)

    def compute_loss_terms(self, data, training=True):
        features, feature_lengths, labels, label_lengths = data[:4]
        network = self.network
        encoded, encoder_lengths = network.encode(features, feature_lengths, training=training)
        logits = network.join(encoded, network.predict(labels, training=training))
        losses = rnnt_loss(logits, labels, encoder_lengths, label_lengths, blank=BLANK_ID)
        if network.config.normalize_by == "tokens":
            count = tf.reduce_sum(label_lengths)
        else:
            count = tf.shape(label_lengths)[0]
        return tf.reduce_sum(losses), count

    def get_config(self):
        return {
            **super().get_config(),
            "network": keras.saving.serialize_keras_object(self.network),
        }
