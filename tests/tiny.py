"""The tiny model shapes the decoding, checkpoint, export and training tests share."""

import dataclasses

from asrkit.config import EncoderConfig, ModelConfig, PredictorConfig

# Tiny encoders of each kind the tests exercise: asrkit's Conformer, its LSTM encoder, and
# the Conformer with an imported NeMo FastConformer's options (relative attention, x8
# depthwise-striding subsampling, xscaling, torch's epsilon, frozen BatchNorm).
TINY_ENCODERS = {
    "conformer": EncoderConfig(kind="conformer", d_model=16, num_blocks=1, num_heads=2,
                               kernel_size=5, subsampling_filters=8, dropout=0.0),
    "lstm": EncoderConfig(kind="lstm", lstm_units=16, lstm_layers=1, subsampling_filters=8,
                          dropout=0.0),
    "nemo_conformer": EncoderConfig(
        kind="conformer", d_model=16, num_blocks=1, num_heads=2, kernel_size=5,
        subsampling_filters=8, dropout=0.0, attention="relative", subsampling="dw_striding",
        subsampling_factor=8, xscaling=True, norm_epsilon=1e-5, conv_norm="frozen_batch",
        batch_norm_momentum=0.9, final_norm="block",
    ),
}  # fmt: skip


def tiny_encoder(kind: str, **changes) -> EncoderConfig:
    """TINY_ENCODERS[kind] with `changes`."""
    return dataclasses.replace(TINY_ENCODERS[kind], **changes)


def tiny_model_config(
    units: int = 16, dropout: float = 0.0, predictor: str = "lstm"
) -> ModelConfig:
    return ModelConfig(
        encoder=EncoderConfig(kind="lstm", lstm_units=units, lstm_layers=1,
                              subsampling_filters=units // 2, dropout=dropout),
        predictor=PredictorConfig(kind=predictor, embed_dim=units // 2, units=units,
                                  dropout=dropout),
        joint_dim=units,
    )  # fmt: skip
