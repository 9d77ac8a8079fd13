"""Features (or audio) and token ids as sharded TFRecords.

Each record: `id` (bytes), `features` (serialized float32 [T, F]), `labels` (int64 [U]),
`text` (the transcript as written, what decoding scores against), `duration` (float,
seconds after speed perturbation). Audio shards (`store="audio"`,
`asrkit.data.audio_shards`) hold `audio` (FLAC bytes) and `samples` instead of `features`,
one record per utterance, its speed drawn per epoch. A transcript with a character the
tokenizer can only encode as `<unk>` is refused, by utterance, before any shard. Shards
are written by parallel threads (TF's kernels release the GIL), each to a temporary file
renamed when complete: a rerun skips the shards that exist, so an interrupted extraction
resumes.

`shards.json` beside them records a fingerprint (the feature settings, the tokenizer's
identity and the speed factors); training, decoding and a rerun of extraction refuse
shards whose fingerprint does not match what they would use, naming what differs.
"""

from __future__ import annotations

import dataclasses
import json
import os
import warnings
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import tensorflow as tf

from asrkit.audio import AudioError
from asrkit.config import ExperimentConfig, FeatureConfig
from asrkit.data.audio_shards import STORES, OnTheFly, audio_features, encode_flac
from asrkit.data.joining import JoinedUtterance, JoinSettings, join_consecutive
from asrkit.data.manifest import Utterance, read_manifest, read_utterance
from asrkit.errors import UserError
from asrkit.features import log_mel, num_frames, perturb_speed
from asrkit.progress import progress
from asrkit.tokenizer import Tokenizer


@dataclass(frozen=True)
class ShardSummary:
    shards: list[Path]
    utterances: int
    frames: int
    skipped_existing: int
    # utterance id -> why its audio could not be read (skipped; refused with `strict`)
    unreadable: dict[str, str] = dataclasses.field(default_factory=dict)


class ShardMismatch(UserError, ValueError):
    """Shards made with other settings than the ones about to use them."""


def serialize_example(
    utt_id: str, features: np.ndarray, labels: list[int], duration: float, text: str = ""
):
    feature = {
        "text": tf.train.Feature(bytes_list=tf.train.BytesList(value=[text.encode()])),
        "id": tf.train.Feature(bytes_list=tf.train.BytesList(value=[utt_id.encode()])),
        "features": tf.train.Feature(
            bytes_list=tf.train.BytesList(
                value=[tf.io.serialize_tensor(tf.constant(features, tf.float32)).numpy()]
            )
        ),
        "labels": tf.train.Feature(int64_list=tf.train.Int64List(value=list(labels))),
        "duration": tf.train.Feature(float_list=tf.train.FloatList(value=[duration])),
    }
    return tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString()


def serialize_audio_example(
    utt_id: str, audio: bytes, samples: int, labels: list[int], duration: float, text: str
):
    feature = {
        "text": tf.train.Feature(bytes_list=tf.train.BytesList(value=[text.encode()])),
        "id": tf.train.Feature(bytes_list=tf.train.BytesList(value=[utt_id.encode()])),
        "audio": tf.train.Feature(bytes_list=tf.train.BytesList(value=[audio])),
        "samples": tf.train.Feature(int64_list=tf.train.Int64List(value=[samples])),
        "labels": tf.train.Feature(int64_list=tf.train.Int64List(value=list(labels))),
        "duration": tf.train.Feature(float_list=tf.train.FloatList(value=[duration])),
    }
    return tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString()


def parse_example(
    record: tf.Tensor, num_mel_bins: int, audio: OnTheFly | None = None, speed=1.0
) -> dict:
    """A record -> its fields and [T, F] features; from an audio shard (`audio` says how)
    the features of its audio at `speed`."""
    spec = {
        "id": tf.io.FixedLenFeature([], tf.string),
        "labels": tf.io.VarLenFeature(tf.int64),
        "duration": tf.io.FixedLenFeature([], tf.float32),
        "text": tf.io.FixedLenFeature([], tf.string, default_value=""),
    }
    spec["audio" if audio is not None else "features"] = tf.io.FixedLenFeature([], tf.string)
    parsed = tf.io.parse_single_example(record, spec)
    if audio is not None:
        features = audio_features(parsed["audio"], tf.cast(speed, tf.float32), audio.features)
    else:
        features = tf.io.parse_tensor(parsed["features"], tf.float32)
    features = tf.ensure_shape(features, [None, num_mel_bins])
    labels = tf.cast(tf.sparse.to_dense(parsed["labels"]), tf.int32)
    return {
        "id": parsed["id"],
        "features": features,
        "feature_lengths": tf.shape(features)[0],
        "labels": labels,
        "label_lengths": tf.shape(labels)[0],
        "duration": parsed["duration"],
        "text": parsed["text"],
    }


def write_shards(
    manifest: str | os.PathLike,
    tokenizer: Tokenizer,
    out_dir: str | os.PathLike,
    num_shards: int = 8,
    speeds: tuple[float, ...] = (1.0,),
    config: FeatureConfig = FeatureConfig(),  # noqa: B008 (frozen, immutable)
    workers: int = 2,
    show_progress: bool = True,
    join: JoinSettings = JoinSettings(),  # noqa: B008 (frozen, immutable)
    allow_unknown: bool = False,
    store: str = "features",
    utterances: list[Utterance] | None = None,
    strict: bool = False,
) -> ShardSummary:
    """Extracts features for every utterance (× every speed factor) into `num_shards` files;
    with `join`, some consecutive utterances of a speaker become one (`asrkit.data.joining`).
    `store="audio"`: each utterance's audio once, the speeds drawn per epoch in training.
    `utterances`: these instead of the manifest's (a NeMo tarred dataset's; `manifest` names
    them). A transcript the tokenizer cannot encode is an error, or with `allow_unknown` (a
    set that is only scored, whose references are the transcripts) a warning. Audio that
    cannot be read (corrupt, truncated, missing) is skipped and listed in the summary and
    shards.json, or with `strict` an error naming it; a failed shard leaves no file."""
    if store not in STORES:
        raise ValueError(f"store must be one of {STORES}, got {store!r}")
    out_dir = Path(out_dir)
    fingerprint = shard_fingerprint(config, tokenizer, speeds)
    if store == "audio":  # absent for feature shards: earlier ones keep their fingerprint
        fingerprint["store"] = store
    if join.enabled:  # absent when off: earlier shards keep their fingerprint
        fingerprint["join"] = join.fingerprint()
    _refuse_other_settings(out_dir, fingerprint)
    listed = read_manifest(manifest) if utterances is None else utterances
    refuse_unknown_characters(listed, tokenizer, manifest, warn=allow_unknown)
    out_dir.mkdir(parents=True, exist_ok=True)
    joined = join_consecutive(listed, join)
    items = [(u, s) for u in joined for s in (speeds if store == "features" else (1.0,))]
    unreadable: dict[str, str] = {}
    shards = [out_dir / f"shard-{i:05d}-of-{num_shards:05d}.tfrecord" for i in range(num_shards)]
    todo = [i for i, path in enumerate(shards) if not path.exists()]

    def write(index: int) -> tuple[int, int]:
        path = shards[index]
        tmp = path.with_suffix(".tmp")
        lengths, tokens, samples = [], [], []
        try:
            _write_shard(tmp, items[index::num_shards], lengths, tokens, samples)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        # Frame and token counts beside each shard: planning need not parse the features.
        counts = {"frames": lengths, "tokens": tokens}
        if store == "audio":  # frames at speed 1; samples give them at any speed
            counts["samples"] = samples
        path.with_suffix(".lengths.json").write_text(json.dumps(counts))
        os.replace(tmp, path)
        return len(lengths), sum(lengths)

    def _write_shard(tmp, shard_items, lengths, tokens, samples) -> None:
        with tf.io.TFRecordWriter(str(tmp)) as writer:
            for utt, speed in shard_items:
                ids = tokenizer.encode(utt.text)
                try:
                    audio = _audio(utt, config)
                except AudioError as err:
                    if strict:
                        raise AudioError(f"utterance {utt.id}: {err} (without --strict it "
                                         "would be skipped and listed)") from None  # fmt: skip
                    unreadable[utt.id] = str(err)
                    continue
                if store == "audio":
                    duration = len(audio) / config.sample_rate
                    flac = encode_flac(audio, config.sample_rate)
                    writer.write(serialize_audio_example(utt.id, flac, len(audio), ids,
                                                         duration, utt.text))  # fmt: skip
                    lengths.append(int(num_frames(len(audio), config)))
                    samples.append(len(audio))
                else:
                    feats, duration = _features(audio, speed, config)
                    utt_id = utt.id if speed == 1.0 else f"sp{speed}-{utt.id}"
                    writer.write(serialize_example(utt_id, feats, ids, duration, utt.text))
                    lengths.append(len(feats))
                tokens.append(len(ids))

    with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
        done = list(
            progress(pool.map(write, todo), total=len(todo), label="shards", enabled=show_progress)
        )
    summary = ShardSummary(
        shards=shards,
        utterances=sum(c for c, _ in done),
        frames=sum(f for _, f in done),
        skipped_existing=num_shards - len(todo),
        unreadable=dict(sorted(unreadable.items())),
    )
    index = {"manifest": str(manifest), "num_shards": num_shards, "fingerprint": fingerprint}
    # a resumed extraction keeps what the first run skipped
    unreadable = {**unreadable_of(out_dir), **unreadable}
    if unreadable:  # skipped: what the shards do not hold, and why
        index["unreadable"] = dict(sorted(unreadable.items()))
    (out_dir / "shards.json").write_text(json.dumps(index, indent=2) + "\n")
    return summary


class UnknownCharacters(UserError, ValueError):
    """Transcripts holding characters the tokenizer cannot encode."""


def unknown_characters(texts, tokenizer: Tokenizer, source, unit="utterance") -> str | None:
    """What in `texts` (each with an `id` and a `text`; `unit`s) the tokenizer cannot
    encode: how many, which characters how often, the first ids; None when all encode."""
    found: dict[str, int] = {}
    bad = []
    for item in texts:
        unknown = tokenizer.unknown(item.text)
        if unknown:
            bad.append(item.id)
            for stretch in unknown:
                found[stretch] = found.get(stretch, 0) + 1
    if not bad:
        return None
    shown = ", ".join(f"{c!r} x{n}" for c, n in sorted(found.items(), key=lambda x: -x[1])[:8])
    return (f"{source}: {len(bad)} {unit}(s) hold characters the tokenizer cannot encode "
            f"({shown}), e.g. {', '.join(bad[:3])}")  # fmt: skip


def refuse_unknown_characters(
    utterances, tokenizer: Tokenizer, manifest, warn: bool = False
) -> None:
    """Every transcript must be encodable without `<unk>`: the tokenizer's pieces are the
    alphabet. Otherwise an error naming the utterances, the characters and their counts,
    before any shard is written (`warn`: the same as one warning)."""
    what = unknown_characters(utterances, tokenizer, manifest)
    if what is None:
        return
    if warn:
        warnings.warn(f"{what}: their labels hold <unk> (scoring uses the transcripts)",
                      stacklevel=2)  # fmt: skip
        return
    raise UnknownCharacters(
        f"{what}: train a tokenizer on these transcripts (`asrkit tokenizer train`; the "
        "fine-tuning recipe's --tokenizer new) or fix them; a set that is only scored may "
        "pass --allow-unknown"
    )


def shard_fingerprint(
    features: FeatureConfig, tokenizer: Tokenizer, speeds: tuple[float, ...] = (1.0,)
) -> dict:
    """What makes shards fit a model: feature settings, tokenizer identity, speed factors."""
    return {
        "features": dataclasses.asdict(features),
        "tokenizer": tokenizer.fingerprint,
        "vocab_size": tokenizer.vocab_size,
        "speeds": [float(s) for s in speeds],
    }


def _differences(recorded: dict, wanted: dict, speeds: bool = False) -> list[str]:
    out = []
    for key in ("features", "tokenizer", "vocab_size", *(("speeds", "join") if speeds else ())):
        old, new = recorded.get(key), wanted.get(key)
        if isinstance(old, dict) and isinstance(new, dict):
            out += [f"{key}.{k} {old.get(k)} != {v}" for k, v in new.items() if old.get(k) != v]
        elif old != new:
            out.append(f"{key} {old} != {new}")
    stored, store = recorded.get("store", "features"), wanted.get("store", "features")
    if speeds and stored != store:
        out.append(f"they hold {stored}, not {store}")
    return out


def _refuse_other_settings(out_dir: Path, fingerprint: dict) -> None:
    """A rerun of extraction may only complete shards made with the same settings."""
    index = out_dir / "shards.json"
    if not any(out_dir.glob("*.tfrecord")):
        return
    recorded = json.loads(index.read_text()).get("fingerprint") if index.exists() else None
    differences = _differences(recorded, fingerprint, speeds=True) if recorded else ["none"]
    if differences:
        raise ShardMismatch(
            f"{out_dir}: holds shards made with other settings ({'; '.join(differences)}); "
            "delete the directory or choose another --out"
        )


def check_shards(
    shard_dir: str | os.PathLike, config: ExperimentConfig, tokenizer: Tokenizer
) -> None:
    """Refuses shards whose fingerprint does not match the config's features and the
    tokenizer (`ShardMismatch` naming what differs and what to do)."""
    index = Path(shard_dir) / "shards.json"
    if not index.exists():
        raise FileNotFoundError(
            f"{index}: missing (not a shard directory, or made by an older asrkit; run "
            "`asrkit features extract`)"
        )
    recorded = json.loads(index.read_text()).get("fingerprint")
    if recorded is None:
        raise ShardMismatch(
            f"{shard_dir}: made by an older asrkit (no fingerprint, no transcripts); re-run "
            "`asrkit features extract` into a new directory"
        )
    differences = _differences(recorded, shard_fingerprint(config.features, tokenizer))
    if differences:
        raise ShardMismatch(
            f"{shard_dir}: made with other settings than this run uses "
            f"({'; '.join(differences)}); re-extract with `asrkit features extract --config` "
            "and this config's tokenizer"
        )


def shard_features(shard_dir: str | os.PathLike, features: FeatureConfig):
    """(files, a dataset of every record's [T, F] features) after checking that the shards
    were made with these feature settings."""
    index = Path(shard_dir) / "shards.json"
    recorded = json.loads(index.read_text()).get("fingerprint") if index.exists() else None
    if recorded is None:
        raise FileNotFoundError(f"{index}: missing (run `asrkit features extract` first)")
    wanted = {"features": dataclasses.asdict(features)}
    differences = _differences({"features": recorded["features"]}, wanted)
    if differences:
        raise ShardMismatch(
            f"{shard_dir}: made with other feature settings ({'; '.join(differences)}); pass "
            "the --config the shards were extracted with"
        )
    files, _ = shard_lengths(shard_dir)
    bins, audio = features.num_mel_bins, on_the_fly(shard_dir, features)
    dataset = tf.data.TFRecordDataset(files).map(
        lambda r: parse_example(r, bins, audio)["features"]
    )
    return files, dataset


def _recorded(shard_dir: str | os.PathLike) -> dict:
    """A shard directory's shards.json ({} where there is none)."""
    index = Path(shard_dir) / "shards.json"
    return json.loads(index.read_text()) if index.exists() else {}


def shard_store(shard_dir: str | os.PathLike) -> str:
    """What the records of a shard directory hold (`STORES`; shards.json says)."""
    return _recorded(shard_dir).get("fingerprint", {}).get("store", "features")


def on_the_fly(shard_dir: str | os.PathLike, features: FeatureConfig) -> OnTheFly | None:
    """For a directory of audio shards, how to compute their features; None for feature
    shards."""
    fingerprint = _recorded(shard_dir).get("fingerprint", {})
    if fingerprint.get("store", "features") != "audio":
        return None
    return OnTheFly(features, tuple(float(s) for s in fingerprint.get("speeds", [1.0])))


def unreadable_of(shard_dir: str | os.PathLike) -> dict[str, str]:
    """The utterances extraction skipped because their audio could not be read (id -> why)."""
    return _recorded(shard_dir).get("unreadable", {})


def shard_lengths(shard_dir: str | os.PathLike) -> tuple[list[str], np.ndarray]:
    """The shard files of a directory and every record's frame count."""
    files, frames, _ = shard_counts(shard_dir)
    return files, frames


def shard_files(shard_dir: str | os.PathLike) -> list[str]:
    """The shard files of a directory, sorted; none is an error saying what makes them."""
    files = sorted(str(p) for p in Path(shard_dir).glob("*.tfrecord"))
    if not files:
        raise FileNotFoundError(
            f"{shard_dir}: no *.tfrecord shards (run `asrkit features extract`)"
        )
    return files


def shard_counts(shard_dir: str | os.PathLike) -> tuple[list[str], np.ndarray, np.ndarray]:
    """The shard files of a directory, every record's frame count and token count."""
    files = shard_files(shard_dir)
    counts = [lengths_index(f) for f in files]
    frames = np.array([n for c in counts for n in c["frames"]], np.int64)
    tokens = np.array([n for c in counts for n in c["tokens"]], np.int64)
    return files, frames, tokens


def lengths_index(shard: str) -> dict:
    """A shard's side file: {"frames": [...], "tokens": [...]}, one entry per record."""
    path = Path(shard).with_suffix(".lengths.json")
    if not path.exists():
        raise FileNotFoundError(f"{path}: missing (re-run `asrkit features extract` for {shard})")
    index = json.loads(path.read_text())
    if not isinstance(index, dict) or not {"frames", "tokens"} <= index.keys():
        raise ValueError(
            f"{path}: not a frames/tokens index (written by an older asrkit?); delete the "
            "shards and re-run `asrkit features extract`"
        )
    return index


def _audio(utt: Utterance | JoinedUtterance, config: FeatureConfig) -> np.ndarray:
    parts = utt.parts if isinstance(utt, JoinedUtterance) else (utt,)
    pieces = [read_utterance(u, config.sample_rate) for u in parts]
    return utt.audio(pieces, config.sample_rate) if len(parts) > 1 else pieces[0]


def _features(audio: np.ndarray, speed: float, config: FeatureConfig) -> tuple[np.ndarray, float]:
    samples = perturb_speed(audio, speed)
    return log_mel(samples, config).numpy(), len(samples) / config.sample_rate
