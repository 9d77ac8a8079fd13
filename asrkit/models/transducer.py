"""The RNN-Transducer: encoder + predictor + joint, trained by the accumulation engine.

Decoders use only `encode`, `predict`/`predictor.step` and `join`. `compute_loss_terms`
returns (Σ per-utterance RNN-T losses, count) with the count set by `normalize_by`:
tokens (Σ label_lengths) or utterances.
"""

from __future__ import annotations

import dataclasses

import keras
import tensorflow as tf

from asrkit.config import EncoderConfig, ModelConfig, PredictorConfig
from asrkit.losses import rnnt_loss
from asrkit.models.conformer import ConformerEncoder
from asrkit.models.joint import Joint
from asrkit.models.lstm_encoder import LSTMEncoder
from asrkit.models.predictor import LSTMPredictor
from asrkit.tokenizer import BLANK_ID
from asrkit.training.accumulation import AccumulatingModel


def build_encoder(config: EncoderConfig):
    if config.kind == "lstm":
        return LSTMEncoder(
            config.lstm_units, config.lstm_layers, config.dropout, config.subsampling_filters,
            name="encoder",
        )  # fmt: skip
    return ConformerEncoder(
        config.d_model, config.num_blocks, config.num_heads, config.kernel_size, config.dropout,
        config.conv_norm, config.subsampling_filters, name="encoder",
    )  # fmt: skip


@keras.saving.register_keras_serializable(package="asrkit")
class Transducer(AccumulatingModel):
    def __init__(self, vocab_size: int, config: ModelConfig | dict | None = None, **kwargs):
        super().__init__(**kwargs)
        if config is None:
            config = ModelConfig()
        elif isinstance(config, dict):
            config = model_config_from_dict(config)
        self.vocab_size, self.config = int(vocab_size), config
        self.encoder = build_encoder(config.encoder)
        p = config.predictor
        self.predictor = LSTMPredictor(
            vocab_size, p.embed_dim, p.units, p.num_layers, p.dropout, name="predictor"
        )
        self.joint = Joint(vocab_size, config.joint_dim, name="joint")

    def encode(self, features, feature_lengths, training=False):
        """features [B, T, F] -> (encoder frames [B, T', D], encoder_lengths [B])."""
        return self.encoder(features, feature_lengths, training=training)

    def predict(self, labels, training=False):
        """labels [B, U] -> predictor states [B, U+1, D]."""
        return self.predictor(labels, training=training)

    def join(self, encoded, predicted):
        return self.joint(encoded, predicted)

    def call(self, batch, training=False):
        """logits [B, T', U+1, V] for a `Batch` (features, feature_lengths, labels, ...)."""
        encoded, _ = self.encode(batch[0], batch[1], training=training)
        return self.join(encoded, self.predict(batch[2], training=training))

    def compute_loss_terms(self, data, training=True):
        features, feature_lengths, labels, label_lengths = data[:4]
        encoded, encoder_lengths = self.encode(features, feature_lengths, training=training)
        logits = self.join(encoded, self.predict(labels, training=training))
        losses = rnnt_loss(logits, labels, encoder_lengths, label_lengths, blank=BLANK_ID)
        if self.config.normalize_by == "tokens":
            count = tf.reduce_sum(label_lengths)
        else:
            count = tf.shape(label_lengths)[0]
        return tf.reduce_sum(losses), count

    def get_config(self):
        return {
            **super().get_config(),
            "vocab_size": self.vocab_size,
            "config": dataclasses.asdict(self.config),
        }


def model_config_from_dict(data: dict) -> ModelConfig:
    return ModelConfig(
        encoder=EncoderConfig(**data.get("encoder", {})),
        predictor=PredictorConfig(**data.get("predictor", {})),
        **{k: v for k, v in data.items() if k not in ("encoder", "predictor")},
    )
