"""Decoding whole shard sets with a trained experiment: load, decode, score."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from asrkit.config import ExperimentConfig, load_config
from asrkit.data.pipeline import PipelineConfig, bucket_plan, make_dataset
from asrkit.data.records import shard_lengths
from asrkit.decoding.greedy import greedy_decode
from asrkit.features import GlobalNormalizer
from asrkit.metrics import ErrorRates, error_rates
from asrkit.tokenizer import Tokenizer


@dataclass(frozen=True)
class DecodeReport:
    references: list[str]
    hypotheses: list[str]
    rates: ErrorRates
    audio_seconds: float


def normalizer_for(config: ExperimentConfig) -> GlobalNormalizer | None:
    if not config.data.cmvn:
        return None
    return GlobalNormalizer.from_dict(json.loads(Path(config.data.cmvn).read_text()))


def decode_shards(
    model,
    shard_dir: str | Path,
    tokenizer: Tokenizer,
    pipe: PipelineConfig,
    normalize=None,
    max_symbols_per_step: int = 3,
) -> DecodeReport:
    files, lengths = shard_lengths(shard_dir)
    pipe = dataclasses.replace(pipe, spec_augment=None)
    dataset = make_dataset(
        files, pipe, *bucket_plan(lengths, pipe), training=False, normalize=normalize
    )
    refs, hyps = [], []
    for batch in dataset:
        found = greedy_decode(
            model, batch.features, batch.feature_lengths, tokenizer, max_symbols_per_step
        )
        for row, hyp in enumerate(found):
            n = int(batch.label_lengths[row])
            refs.append(tokenizer.decode(batch.labels[row, :n].numpy().tolist()))
            hyps.append(hyp.text)
    seconds = float(lengths.sum()) * pipe.frame_step_seconds
    return DecodeReport(refs, hyps, error_rates(refs, hyps), seconds)


def load_experiment(exp_dir: str | Path, checkpoint: str | None = None):
    """(model, config, tokenizer) of an experiment, weights from its latest checkpoint."""
    from asrkit.training.checkpoints import CheckpointManager, restore
    from asrkit.training.trainer import build_model

    exp_dir = Path(exp_dir)
    config = load_config(exp_dir / "config.yaml")
    tokenizer = Tokenizer.load(config.data.tokenizer)
    path = Path(checkpoint) if checkpoint else CheckpointManager(exp_dir / "checkpoints").latest()
    if path is None:
        raise FileNotFoundError(f"{exp_dir}/checkpoints: no checkpoint to decode with")
    model = build_model(config, tokenizer.vocab_size, steps=1)
    model.build_engine(dummy_batch(config.features.num_mel_bins))
    restore(model, path, with_optimizer=False)
    return model, config, tokenizer


def dummy_batch(num_mel_bins: int):
    """A one-utterance batch that builds every layer of a transducer."""
    return (
        np.zeros((1, 64, num_mel_bins), np.float32),
        np.array([64], np.int32),
        np.ones((1, 1), np.int32),
        np.array([1], np.int32),
    )
