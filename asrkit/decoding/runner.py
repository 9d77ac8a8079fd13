"""Decoding whole test sets with a trained experiment: load, decode, score.

Two sources of utterances: TFRecord shards from `asrkit features extract` (references are
the transcripts stored in the shards) or a JSONL manifest (audio is read and featurised
here; references are the manifest's text). Both are decoded in batches sorted
by length, nothing is filtered out: every utterance is decoded and scored.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import tensorflow as tf

from asrkit.config import ExperimentConfig, FeatureConfig
from asrkit.data.manifest import read_manifest, read_utterance
from asrkit.data.pipeline import PipelineConfig, bucket_plan
from asrkit.data.records import on_the_fly, parse_example, shard_lengths, shard_store
from asrkit.decoding.search import DEFAULT_OPTIONS, DecodeOptions, decode_batch
from asrkit.errors import InputError
from asrkit.features import MIN_FEATURE_FRAMES, compiled_log_mel_batch, normalizer_for
from asrkit.metrics import DEFAULT_SCORER, ErrorRates, error_rates, word_errors
from asrkit.tokenizer import Tokenizer


@dataclass(frozen=True)
class UtteranceResult:
    id: str
    reference: str
    hypothesis: str
    score: float
    errors: int  # word substitutions + deletions + insertions
    words: int  # reference words


@dataclass(frozen=True)
class DecodeReport:
    utterances: list[UtteranceResult]
    rates: ErrorRates
    audio_seconds: float
    decode_seconds: float

    @property
    def rtf(self) -> float:
        """Real-time factor: decoding wall time / audio duration (features included)."""
        return self.decode_seconds / max(self.audio_seconds, 1e-9)

    def worst(self, n: int = 10) -> list[UtteranceResult]:
        ranked = sorted(self.utterances, key=lambda u: (-u.errors, -u.errors / max(u.words, 1)))
        return [u for u in ranked[:n] if u.errors > 0]


@dataclass(frozen=True)
class _Batch:
    ids: list[str]
    features: np.ndarray | tf.Tensor  # [B, T, F]
    feature_lengths: np.ndarray | tf.Tensor  # [B]
    references: list[str]
    audio_seconds: float


def decode_shards(
    model,
    shard_dir: str | Path,
    tokenizer: Tokenizer,
    pipe: PipelineConfig,
    normalize=None,
    options: DecodeOptions = DEFAULT_OPTIONS,
    num_mel_bins: int = 80,
    scorer: str = DEFAULT_SCORER,
    boost=None,
    features: FeatureConfig | None = None,
) -> DecodeReport:
    """Decodes a shard directory; audio shards need the `features` to compute (at speed 1)."""
    batches = _shard_batches(shard_dir, pipe, normalize, num_mel_bins, features)
    return _decode(model, batches, tokenizer, options, shard_dir, scorer, boost)


def decode_manifest(
    model,
    manifest: str | Path,
    tokenizer: Tokenizer,
    config: ExperimentConfig,
    options: DecodeOptions = DEFAULT_OPTIONS,
    scorer: str = DEFAULT_SCORER,
    boost=None,
) -> DecodeReport:
    batches = _manifest_batches(
        manifest, config.features, normalizer_for(config.data.cmvn), config.data.batch_seconds
    )
    return _decode(model, batches, tokenizer, options, manifest, scorer, boost)


def _decode(
    model, batches, tokenizer: Tokenizer, options: DecodeOptions, source, scorer: str,
    boost=None,
) -> DecodeReport:  # fmt: skip
    """`boost`: fusion tables (word boosting, LM: `asrkit.decoding.fusion`) or None."""
    start = time.monotonic()
    results, seconds = [], 0.0
    for batch in batches:
        found = decode_batch(
            model, batch.features, batch.feature_lengths, tokenizer, options, boost
        )
        for uid, ref, hyp in zip(batch.ids, batch.references, found, strict=True):
            errors, words = word_errors(ref, hyp.text, scorer)
            results.append(UtteranceResult(uid, ref, hyp.text, hyp.score, errors, words))
        seconds += batch.audio_seconds
    elapsed = time.monotonic() - start
    if not results:
        raise InputError(f"{source}: nothing to decode (no utterances)")
    rates = error_rates([r.reference for r in results], [r.hypothesis for r in results], scorer)
    return DecodeReport(results, rates, seconds, elapsed)


def _shard_batches(
    shard_dir, pipe: PipelineConfig, normalize, num_mel_bins: int, features=None
) -> Iterator[_Batch]:
    files, lengths = shard_lengths(shard_dir)
    boundaries, sizes = bucket_plan(lengths, pipe)
    audio = None
    if shard_store(shard_dir) == "audio":
        if features is None:
            raise InputError(f"{shard_dir}: audio shards; decoding them needs the features config")
        audio, num_mel_bins = on_the_fly(shard_dir, features), features.num_mel_bins
    dataset = tf.data.TFRecordDataset(files).map(
        lambda r: parse_example(r, num_mel_bins, audio), num_parallel_calls=4
    )
    if normalize is not None:
        dataset = dataset.map(lambda e: {**e, "features": normalize(e["features"])})
    dataset = dataset.bucket_by_sequence_length(
        lambda e: e["feature_lengths"], boundaries, [*sizes, 1], drop_remainder=False
    )
    for batch in dataset.prefetch(2):
        yield _Batch(
            ids=[i.decode() for i in batch["id"].numpy()],
            features=batch["features"],
            feature_lengths=batch["feature_lengths"],
            references=[t.decode() for t in batch["text"].numpy()],
            audio_seconds=float(np.sum(batch["duration"].numpy())),
        )


def _manifest_batches(
    manifest, features: FeatureConfig, normalize, batch_seconds: float
) -> Iterator[_Batch]:
    utterances = read_manifest(manifest)
    for group in by_budget(utterances, [u.duration for u in utterances], batch_seconds):
        yield _featurise(group, features, normalize)


def by_budget(items: list, durations: list[float], budget: float) -> Iterator[list]:
    """Items shortest first, in groups whose padded audio (size x longest) stays within
    `budget` seconds (a longer item alone forms its own group)."""
    order = sorted(range(len(items)), key=lambda i: durations[i])
    group: list[int] = []
    for i in order:
        if group and (len(group) + 1) * durations[i] > budget:
            yield [items[j] for j in group]
            group = []
        group.append(i)
    if group:
        yield [items[j] for j in group]


def _featurise(utterances, config: FeatureConfig, normalize) -> _Batch:
    """A padded batch of manifest `utterances` (whole files or segments)."""
    audio = [read_utterance(u, config.sample_rate) for u in utterances]
    batch = featurise_samples(audio, config, normalize)
    ids, refs = [u.id for u in utterances], [u.text for u in utterances]
    return replace(batch, ids=list(ids), references=list(refs))


def featurise_samples(audio: list[np.ndarray], config: FeatureConfig, normalize) -> _Batch:
    """A padded feature batch from waveforms (no ids or references): one compiled call for
    the whole batch; frames past each utterance's own are zero."""
    sizes = np.array([len(samples) for samples in audio], np.int32)
    waves = np.zeros((len(audio), max(int(sizes.max()), 1)), np.float32)
    for row, samples in enumerate(audio):
        waves[row, : sizes[row]] = samples
    feats, lengths = compiled_log_mel_batch(config)(waves, sizes)
    feats = normalize(feats) if normalize is not None else feats
    lengths = lengths.numpy().astype(np.int32)
    padded = np.zeros(
        (len(audio), max(lengths.max(), MIN_FEATURE_FRAMES), config.num_mel_bins), np.float32
    )
    feats = np.asarray(feats)
    for row, n in enumerate(lengths):
        padded[row, :n] = feats[row, :n]
    seconds = float(sizes.sum()) / config.sample_rate
    return _Batch([""] * len(audio), padded, lengths, [""] * len(audio), seconds)
