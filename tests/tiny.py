"""The tiny LSTM transducer shape the decoding, checkpoint and export tests share."""

from asrkit.config import EncoderConfig, ModelConfig, PredictorConfig


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
