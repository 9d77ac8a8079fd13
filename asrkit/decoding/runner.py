"""Decoding whole test sets through a `Recogniser`: decode, score.

Two sources of utterances: TFRecord shards from `asrkit features extract` (references are
the transcripts stored in the shards; the recogniser's search from their features) or a
JSONL manifest (audio read here, featurised in the recogniser; references are the
manifest's text). Both are decoded in batches sorted by length, each utterance whole;
nothing is filtered out: every utterance is decoded and scored.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import tensorflow as tf

from asrkit.data.manifest import read_manifest, read_utterance
from asrkit.data.pipeline import PipelineConfig, bucket_plan
from asrkit.data.records import on_the_fly, parse_example, shard_lengths
from asrkit.decoding.recogniser import Recogniser
from asrkit.decoding.search.front import found_hypotheses
from asrkit.errors import InputError
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
    inputs: tuple  # (features [B, T, F], frames [B]) or (waveforms [B, S], lengths [B])
    references: list[str]
    audio_seconds: float


def decode_shards(
    recogniser: Recogniser,
    shard_dir: str | Path,
    tokenizer: Tokenizer,
    pipe: PipelineConfig,
    scorer: str = DEFAULT_SCORER,
    boost=None,
) -> DecodeReport:
    """Decodes a shard directory through `recogniser` (its features and statistics; audio
    shards featurised at speed 1). `boost`: fusion tables (word boosting, LM:
    `asrkit.decoding.fusion.tables`) or None."""
    batches = _shard_batches(shard_dir, pipe, recogniser)
    return _decode(recogniser.find, batches, tokenizer, shard_dir, scorer, boost)


def decode_manifest(
    recogniser: Recogniser,
    manifest: str | Path,
    tokenizer: Tokenizer,
    batch_seconds: float,
    scorer: str = DEFAULT_SCORER,
    boost=None,
) -> DecodeReport:
    """Decodes a manifest's utterances (each whole) through `recogniser`, in batches of at
    most `batch_seconds` padded audio."""
    batches = _manifest_batches(manifest, recogniser.rate, batch_seconds)
    return _decode(recogniser.find_waveforms, batches, tokenizer, manifest, scorer, boost)


def _decode(find, batches, tokenizer: Tokenizer, source, scorer: str, boost=None) -> DecodeReport:
    start = time.monotonic()
    results, seconds = [], 0.0
    for batch in batches:
        found = found_hypotheses(find(*batch.inputs, boost), tokenizer, limit=1)
        for uid, ref, (hyp,) in zip(batch.ids, batch.references, found, strict=True):
            errors, words = word_errors(ref, hyp.text, scorer)
            results.append(UtteranceResult(uid, ref, hyp.text, hyp.score, errors, words))
        seconds += batch.audio_seconds
    elapsed = time.monotonic() - start
    if not results:
        raise InputError(f"{source}: nothing to decode (no utterances)")
    rates = error_rates([r.reference for r in results], [r.hypothesis for r in results], scorer)
    return DecodeReport(results, rates, seconds, elapsed)


def _shard_batches(shard_dir, pipe: PipelineConfig, recogniser: Recogniser) -> Iterator[_Batch]:
    files, lengths = shard_lengths(shard_dir)
    boundaries, sizes = bucket_plan(lengths, pipe)
    features = recogniser.features
    audio = on_the_fly(shard_dir, features)  # None for feature shards
    dataset = tf.data.TFRecordDataset(files).map(
        lambda r: parse_example(r, features.num_mel_bins, audio), num_parallel_calls=4
    )
    if recogniser.statistics is not None:
        dataset = dataset.map(lambda e: {**e, "features": recogniser.normalise(e["features"])})
    dataset = dataset.bucket_by_sequence_length(
        lambda e: e["feature_lengths"], boundaries, [*sizes, 1], drop_remainder=False
    )
    for batch in dataset.prefetch(2):
        yield _Batch(
            ids=[i.decode() for i in batch["id"].numpy()],
            inputs=(batch["features"], batch["feature_lengths"]),
            references=[t.decode() for t in batch["text"].numpy()],
            audio_seconds=float(np.sum(batch["duration"].numpy())),
        )


def _manifest_batches(manifest, rate: int, batch_seconds: float) -> Iterator[_Batch]:
    utterances = read_manifest(manifest)
    for group in by_budget(utterances, [u.duration for u in utterances], batch_seconds):
        audio = [read_utterance(u, rate) for u in group]
        yield _Batch(
            ids=[u.id for u in group],
            inputs=padded_waveforms(audio),
            references=[u.text for u in group],
            audio_seconds=sum(len(a) for a in audio) / rate,
        )


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


def padded_waveforms(waveforms: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """Waveforms -> zero-padded [N, S] float32 and their lengths [N] int32."""
    lengths = np.array([len(w) for w in waveforms], np.int32)
    padded = np.zeros((len(waveforms), max(int(lengths.max()), 1)), np.float32)
    for row, samples in enumerate(waveforms):
        padded[row, : lengths[row]] = samples
    return padded, lengths
