"""The transducer *network*: encoder + predictor + joint, a plain Keras model.

Like a keras-hub Backbone, it knows nothing of losses or optimizers: decoding, export and
fine-tuning build and load it alone. Training wraps it in `asrkit.training.task.
TransducerTask`, which owns the loss and the accumulation engine. Decoders use only
`encode`, `predict_labels`/`predictor.step` and `join`; a hybrid network
(`model.ctc_head`) also has `ctc_logits`, which CTC decoding and the CTC loss use.
"""

from __future__ import annotations

import dataclasses

import keras
import numpy as np
import tensorflow as tf

from asrkit.config import (
    ENCODER_PRECISIONS,
    AdaptersConfig,
    EncoderConfig,
    ModelConfig,
    PredictorConfig,
)
from asrkit.models.conformer import ENCODER_OPTIONS, ConformerEncoder
from asrkit.models.encoder import Encoder
from asrkit.models.joint import Joint
from asrkit.models.layers import dtype_policy
from asrkit.models.lstm_encoder import LSTMEncoder
from asrkit.models.predictor import build_predictor


def build_encoder(config: EncoderConfig, adapter_dim: int = 0) -> Encoder:
    """`adapter_dim` > 0: a linear adapter of that many units on each Conformer block."""
    if config.kind == "lstm":
        if adapter_dim:
            raise ValueError(
                "model.adapters.kind linear adds an adapter to each Conformer block; an lstm "
                "encoder has none (use kind lora with targets [joint])"
            )
        return LSTMEncoder(
            units=config.lstm_units, num_layers=config.lstm_layers, dropout=config.dropout,
            subsampling_filters=config.subsampling_filters, recompute=config.recompute,
            name="encoder",
        )  # fmt: skip
    options = {k: getattr(config, k) for k in ENCODER_OPTIONS}
    return ConformerEncoder(
        d_model=config.d_model, num_blocks=config.num_blocks, num_heads=config.num_heads,
        kernel_size=config.kernel_size, dropout=config.dropout, conv_norm=config.conv_norm,
        subsampling_filters=config.subsampling_filters, final_norm=config.final_norm,
        adapter_dim=adapter_dim, name="encoder", **options,
    )  # fmt: skip


@keras.saving.register_keras_serializable(package="asrkit")
class Transducer(keras.Model):
    def __init__(
        self, vocab_size: int, config: ModelConfig | dict | None = None,
        encoder_precision: str | None = None, **kwargs,
    ):  # fmt: skip
        """`encoder_precision` (inference only, `ENCODER_PRECISIONS`): the encoder's weights
        and arithmetic in bfloat16 instead of the dtype policy's. Its matrix products then
        run on the cores' bfloat16 units (AMX, AVX512-BF16) and its weights take half the
        memory; float32 weights assigned to it are rounded once. The norms' statistics, the
        attention's softmax and the depthwise convolution stay float32, and the frames
        leave as float32 (`encode`), so the predictor, the joint and the search are as
        they were. Not for training: mixed precision (`train.precision`) keeps float32
        master weights."""
        super().__init__(**kwargs)
        if config is None:
            config = ModelConfig()
        elif isinstance(config, dict):
            config = model_config_from_dict(config)
        self.vocab_size, self.config = int(vocab_size), config
        adapters = config.adapters
        if encoder_precision not in (None, *ENCODER_PRECISIONS):
            raise ValueError(
                f"encoder precision must be one of {ENCODER_PRECISIONS}, got {encoder_precision!r}"
            )
        if encoder_precision == "bfloat16" and config.encoder.kind != "conformer":
            raise ValueError(f"a bfloat16 encoder is a Conformer (not {config.encoder.kind})")
        with dtype_policy(encoder_precision):
            self.encoder = build_encoder(
                config.encoder, adapters.dim if adapters.kind == "linear" else 0
            )
        self.predictor = build_predictor(vocab_size, config.predictor, config.torch_biases)
        self.joint = Joint(
            vocab_size=vocab_size, dim=config.joint_dim, activation=config.joint_activation,
            durations=len(config.durations), predictor_bias=config.torch_biases, name="joint",
        )  # fmt: skip
        self.ctc_head = keras.layers.Dense(vocab_size, name="ctc_head") if config.ctc_head else None

    def build(self, *args, **kwargs):
        # Made only of sub-layers, which build themselves on their first call.
        self.built = True

    def encode(self, features, feature_lengths, training=False, chunk_frames=None):
        """features [B, T, F] -> (encoder frames [B, T', D], encoder_lengths [B]).
        `chunk_frames` (Conformer): this call's chunk size instead of the configured one.
        The frames leave in the joint's compute dtype (an encoder of another precision
        hands float32 frames on)."""
        if chunk_frames is None:
            encoded, lengths = self.encoder(features, feature_lengths, training=training)
        else:
            encoded, lengths = self.encoder(
                features, feature_lengths, training=training, chunk_frames=chunk_frames
            )
        if self.encoder.compute_dtype != self.joint.compute_dtype:
            encoded = tf.cast(encoded, self.joint.compute_dtype)
        return encoded, lengths

    def predict_labels(self, labels, training=False):
        """labels [B, U] -> predictor states [B, U+1, D]. (Not `predict`: that is
        keras.Model's batch inference loop, which this model does not use.)"""
        return self.predictor(labels, training=training)

    def join(self, encoded, predicted):
        return self.joint(encoded, predicted)

    def ctc_logits(self, encoded):
        """encoder frames [B, T', D] -> the CTC head's logits [B, T', V] (blank at 0)."""
        if self.ctc_head is None:
            raise ValueError("this network has no CTC head (model.ctc_head is false)")
        return self.ctc_head(encoded)

    def call(self, batch, training=False):
        """logits [B, T', U+1, V] for (features, feature_lengths, labels, ...)."""
        encoded, _ = self.encode(batch[0], batch[1], training=training)
        return self.join(encoded, self.predict_labels(batch[2], training=training))

    def build_from_features(self, num_mel_bins: int) -> None:
        """Creates every variable with one tiny forward pass (no optimizer involved)."""
        if self.joint.built:
            return
        batch = dummy_batch(num_mel_bins)
        encoded, _ = self.encode(batch[0], batch[1])
        predicted = self.predict_labels(batch[2])
        self.join(encoded, predicted)
        if self.ctc_head is not None:
            self.ctc_head(encoded)
        self.built = True

    def get_config(self):
        return {
            **super().get_config(),
            "vocab_size": self.vocab_size,
            "config": dataclasses.asdict(self.config),
        }


def dummy_batch(num_mel_bins: int):
    """A one-utterance (features, feature_lengths, labels, label_lengths) that builds every
    layer of a transducer."""
    return (
        np.zeros((1, 64, num_mel_bins), np.float32),
        np.array([64], np.int32),
        np.ones((1, 1), np.int32),
        np.array([1], np.int32),
    )


def model_config_from_dict(data: dict) -> ModelConfig:
    data = {**data, "durations": tuple(data.get("durations", ()))}
    return ModelConfig(
        encoder=EncoderConfig(**data.get("encoder", {})),
        predictor=PredictorConfig(**data.get("predictor", {})),
        adapters=AdaptersConfig(**data.get("adapters", {})),
        **{k: v for k, v in data.items() if k not in ("encoder", "predictor", "adapters")},
    )
