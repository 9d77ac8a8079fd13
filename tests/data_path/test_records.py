"""Shard fingerprints and transcripts: mismatched shards are refused naming what differs,
and the reference text comes from the transcript, not from token ids."""

import json

import numpy as np
import pytest
import tensorflow as tf

from asrkit.config import ExperimentConfig, FeatureConfig, load_config
from asrkit.data.manifest import read_manifest
from asrkit.data.pipeline import PipelineConfig
from asrkit.data.records import (
    ShardMismatch,
    check_shards,
    parse_example,
    shard_features,
    write_shards,
)
from asrkit.decoding.recogniser import Recogniser
from asrkit.decoding.runner import decode_shards
from asrkit.tokenizer import train_tokenizer
from tests.decoding.conftest import tiny_transducer


def _config(**features):
    return ExperimentConfig(features=FeatureConfig(**features))


def test_shards_carry_a_fingerprint_and_are_refused_on_other_settings(corpus, tmp_path):
    _, manifest, tok = corpus
    small = FeatureConfig(num_mel_bins=64)
    write_shards(manifest, tok, tmp_path / "s64", num_shards=2, config=small, show_progress=False)
    check_shards(tmp_path / "s64", _config(num_mel_bins=64), tok)  # the settings they were made
    with pytest.raises(ShardMismatch, match=r"features\.num_mel_bins 64 != 80"):
        check_shards(tmp_path / "s64", _config(), tok)
    other = train_tokenizer([u.text for u in read_manifest(manifest)] * 3, tmp_path / "tok2",
                            24, "char")  # fmt: skip
    with pytest.raises(ShardMismatch, match=r"tokenizer \w+ != \w+"):
        check_shards(tmp_path / "s64", _config(num_mel_bins=64), other)
    # A rerun of extraction into the same directory with other settings is refused too.
    with pytest.raises(ShardMismatch, match=r"features\.num_mel_bins 64 != 80.*another --out"):
        write_shards(manifest, tok, tmp_path / "s64", num_shards=2, show_progress=False)
    with pytest.raises(ShardMismatch, match=r"speeds"):
        write_shards(manifest, tok, tmp_path / "s64", num_shards=2, config=small,
                     speeds=(0.9, 1.0), show_progress=False)  # fmt: skip
    index = json.loads((tmp_path / "s64" / "shards.json").read_text())
    assert index["fingerprint"]["features"]["num_mel_bins"] == 64
    # and the statistics are computed with those settings (64 bins)
    files, frames = shard_features(tmp_path / "s64", small)
    assert next(iter(frames)).shape[-1] == 64 and len(files) == 2
    with pytest.raises(ShardMismatch, match="--config"):
        shard_features(tmp_path / "s64", FeatureConfig())


def test_shards_made_before_fingerprints_are_refused(corpus, tmp_path):
    _, manifest, tok = corpus
    write_shards(manifest, tok, tmp_path / "old", num_shards=1, show_progress=False)
    (tmp_path / "old" / "shards.json").write_text(json.dumps({"speeds": [1.0]}))
    with pytest.raises(ShardMismatch, match=r"an older asrkit.*features extract"):
        check_shards(tmp_path / "old", _config(), tok)


def test_references_are_the_stored_transcripts_not_token_ids(corpus, tmp_path):
    """Shards keep each transcript as written (what decoding scores against), beside its
    ids; the tokenizer decodes the ids upper-cased, the transcript stays as it was."""
    from asrkit.data.manifest import write_manifest

    _, manifest, tok = corpus
    utts = [u.__class__(**{**u.__dict__, "text": u.text.lower()}) for u in read_manifest(manifest)]
    write_manifest(tmp_path / "lower.jsonl", utts)
    write_shards(tmp_path / "lower.jsonl", tok, tmp_path / "s", num_shards=1, show_progress=False)
    records = [parse_example(r, 80) for r in tf.data.TFRecordDataset(
        sorted(str(p) for p in (tmp_path / "s").glob("*.tfrecord")))]  # fmt: skip
    stored = {e["id"].numpy().decode(): e["text"].numpy().decode() for e in records}
    assert stored == {u.id: u.text for u in utts}
    assert all(tok.decode(e["labels"].numpy()) == e["text"].numpy().decode().upper()
               for e in records)  # fmt: skip
    network = tiny_transducer(tok.vocab_size, seed=0)
    recogniser = Recogniser(network, tok.surface_pieces(), FeatureConfig())
    report = decode_shards(recogniser, tmp_path / "s", tok, PipelineConfig(batch_seconds=20.0))
    assert {u.id: u.reference for u in report.utterances} == {u.id: u.text for u in utts}


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("train.epochs=0", "train.epochs must be >= 1, got 0"),
        ("train.keep_checkpoints=0", "train.keep_checkpoints must be >= 1"),
        ("data.batch_seconds=0", "data.batch_seconds must be > 0"),
        ("train.learning_rate=-1", "train.learning_rate must be > 0"),
        ("model.encoder.dropout=1.5", r"model.encoder.dropout must be in \[0, 1\)"),
        ("decode.max_symbols_per_step=0", "decode.max_symbols_per_step must be >= 1"),
        ("train.max_symbol=2", "unknown key 'max_symbol' in section 'train'"),
    ],
)
def test_config_values_are_range_checked_with_the_key_named(override, message):
    from asrkit.config import ConfigError

    with pytest.raises(ConfigError, match=message):
        load_config(None, [override])


def test_features_are_those_the_config_names(corpus, tmp_path):
    _, manifest, tok = corpus
    write_shards(manifest, tok, tmp_path / "a", num_shards=1, show_progress=False,
                 config=FeatureConfig(num_mel_bins=40, frame_step=80))  # fmt: skip
    e = parse_example(next(iter(tf.data.TFRecordDataset(
        str(next((tmp_path / "a").glob("*.tfrecord")))))), 40)  # fmt: skip
    assert e["features"].shape[-1] == 40
    # a 5 ms hop: the frame formula with frame_step 80, not the default 160
    ref = next(u for u in read_manifest(manifest) if u.id == e["id"].numpy().decode())
    samples = round(ref.duration * 16000)
    assert int(e["feature_lengths"]) == pytest.approx(1 + (samples - 400) // 80, abs=1)
    assert np.isfinite(e["features"].numpy()).all()


def test_characters_the_tokenizer_cannot_encode_are_refused_before_any_shard(corpus, tmp_path):
    """The tokenizer's pieces are the alphabet: a transcript with a character it can only
    encode as <unk> is named (utterance, character, count) and nothing is written."""
    from asrkit.data.manifest import write_manifest
    from asrkit.data.records import UnknownCharacters

    _, manifest, tok = corpus
    utterances = read_manifest(manifest)
    first, second = utterances[0], utterances[1]
    changed = [first.__class__(**{**first.__dict__, "text": first.text + " GRÜSSE"}),
               second.__class__(**{**second.__dict__, "text": "ÜBER " + second.text}),
               *utterances[2:]]  # fmt: skip
    write_manifest(tmp_path / "m.jsonl", changed)
    with pytest.raises(UnknownCharacters) as caught:
        write_shards(tmp_path / "m.jsonl", tok, tmp_path / "s", num_shards=1, show_progress=False)
    message = str(caught.value)
    assert "2 utterance(s)" in message and "'ü' x2" in message
    assert first.id in message and second.id in message
    assert not (tmp_path / "s").exists()


def test_a_scored_set_may_hold_unknown_characters_with_a_warning(corpus, tmp_path):
    from asrkit.data.manifest import write_manifest

    _, manifest, tok = corpus
    utterances = read_manifest(manifest)
    first = utterances[0]
    write_manifest(tmp_path / "m.jsonl",
                   [first.__class__(**{**first.__dict__, "text": first.text + " Ü"})])  # fmt: skip
    with pytest.warns(UserWarning, match="1 utterance.*'ü' x1.*scoring uses the transcripts"):
        write_shards(tmp_path / "m.jsonl", tok, tmp_path / "s", num_shards=1,
                     show_progress=False, allow_unknown=True)  # fmt: skip
    assert len(list((tmp_path / "s").glob("*.tfrecord"))) == 1
