"""The training *task* around a transducer network: the RNN-T loss and the accumulation
engine (keras-hub's Task around a Backbone).

`compute_loss_terms` returns (Σ per-utterance losses, count) — each utterance's RNN-T loss
(full, fused or pruned) plus `model.ctc_weight` × its CTC loss — with the count set by
`model.normalize_by`: tokens (Σ label_lengths) or utterances. `fit` on the task is the
user's training API; `task.network` is what decoding, export and fine-tuning use.
"""

from __future__ import annotations

import keras
import tensorflow as tf

from asrkit.losses import (
    ctc_losses,
    fused_joint_rnnt_loss,
    fused_simple_loss,
    loss_scales,
    prune_ranges,
    pruned_loss,
    rnnt_loss,
    simple_loss,
)
from asrkit.models.conformer import dynamic_chunk_frames
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
        network, config = self.network, self.network.config
        network.build_from_features(features.shape[-1])  # the fused path skips the joint's call
        chunk = None
        if training and config.encoder.dynamic_chunks:
            chunk = dynamic_chunk_frames(self._updates(), config.encoder.dynamic_chunks)
        encoded, encoder_lengths = network.encode(
            features, feature_lengths, training=training, chunk_frames=chunk
        )
        predicted = network.predict_labels(labels, training=training)
        if config.loss == "pruned":
            losses = self._pruned_losses(encoded, predicted, labels, encoder_lengths, label_lengths)
        elif config.fused_joint_loss:
            joint = network.joint
            enc_h, pred_h = joint.project(encoded, predicted)
            out = joint.output_layer
            losses = fused_joint_rnnt_loss(
                enc_h, pred_h, out.kernel, out.bias, labels, encoder_lengths, label_lengths,
                blank=BLANK_ID, chunk_bytes=int(config.joint_chunk_mb * 2**20),
                delay_penalty=config.delay_penalty,
            )  # fmt: skip
        else:
            logits = network.join(encoded, predicted)
            losses = rnnt_loss(
                logits, labels, encoder_lengths, label_lengths, blank=BLANK_ID,
                delay_penalty=config.delay_penalty,
            )  # fmt: skip
        if network.ctc_head is not None:
            ctc = ctc_losses(
                network.ctc_head(encoded), labels, encoder_lengths, label_lengths, BLANK_ID
            )
            losses = losses + config.ctc_weight * ctc
        if config.normalize_by == "tokens":
            count = tf.reduce_sum(label_lengths)
        else:
            count = tf.shape(label_lengths)[0]
        return tf.reduce_sum(losses), count

    def _pruned_losses(self, encoded, predicted, labels, encoder_lengths, label_lengths):
        """icefall's recipe: simple · simple_loss + pruned · pruned_loss, the weights warmed
        up over optimizer updates (read from the optimizer, so never micro-batches)."""
        network, config = self.network, self.network.config
        chunk_bytes = int(config.pruned_chunk_mb * 2**20)
        if config.fused_joint_loss:  # the encoder's projection to V chunk by chunk
            am_proj = network.simple.am_proj
            simple, occupancy = fused_simple_loss(
                encoded, am_proj.kernel, am_proj.bias, network.simple.lm_proj(predicted),
                labels, encoder_lengths, label_lengths, BLANK_ID, config.lm_only_scale,
                config.am_only_scale, chunk_bytes,
            )  # fmt: skip
        else:
            am, lm = network.simple(encoded, predicted)
            simple, occupancy = simple_loss(
                am, lm, labels, encoder_lengths, label_lengths, BLANK_ID,
                config.lm_only_scale, config.am_only_scale,
            )  # fmt: skip
        s_begin = prune_ranges(occupancy, encoder_lengths, label_lengths, config.prune_range)
        enc_h, pred_h = network.joint.project(encoded, predicted)
        pruned = pruned_loss(
            enc_h, pred_h, network.joint.output_layer, labels, encoder_lengths, label_lengths,
            s_begin, config.prune_range, BLANK_ID, fused=config.fused_joint_loss,
            chunk_bytes=chunk_bytes,
        )  # fmt: skip
        updates = self._updates(default=config.loss_warmup_updates)
        simple_weight, pruned_weight = loss_scales(
            updates, config.loss_warmup_updates, config.simple_loss_scale
        )
        return simple_weight * simple + pruned_weight * pruned

    def _updates(self, default: int = 0):
        """Optimizer updates so far (never micro-batches): what schedules inside the loss
        count in; `default` before the task is compiled."""
        optimizer = getattr(self, "optimizer", None)
        return optimizer.iterations if optimizer is not None else default

    def get_config(self):
        return {
            **super().get_config(),
            "network": keras.saving.serialize_keras_object(self.network),
        }
