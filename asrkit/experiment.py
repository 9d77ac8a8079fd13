"""An experiment directory: what it holds, and loading it for inference.

    <exp>/config.yaml     the resolved config; `data.tokenizer` and `data.cmvn` point inside
    <exp>/tokenizer/      a copy of the tokenizer it was trained with
    <exp>/cmvn.json       a copy of the feature statistics (if any)
    <exp>/plan.json       a copy of the memory plan it trains with (if any; `asrkit plan`)
    <exp>/timing.json     its emission delay, subtracted from word times (`asrkit calibrate`)
    <exp>/checkpoints/    ckpt-<updates>/ (see `asrkit.checkpoints`)

Everything decoding, export, averaging or fine-tuning needs lives inside, so an experiment
works from any working directory and after being moved or copied to another machine; a
retrained tokenizer elsewhere cannot change it. Loading for inference builds the network
alone: no training code is imported and no optimizer state is created.
"""

from __future__ import annotations

import dataclasses
import filecmp
import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from asrkit.config import (
    ConfigError,
    ExperimentConfig,
    config_from_data,
    read_config_data,
)
from asrkit.errors import InputError, UserError
from asrkit.tokenizer import Tokenizer

if TYPE_CHECKING:  # TensorFlow is imported only by what builds or loads a network
    from asrkit.features import GlobalNormalizer
    from asrkit.models.transducer import Transducer

CONFIG_FILE = "config.yaml"
TOKENIZER_DIR = "tokenizer"
CMVN_FILE = "cmvn.json"
PLAN_FILE = "plan.json"
TIMING_FILE = "timing.json"
TRAINING_LENGTHS_FILE = "training_lengths.json"
TOKENIZER_FILES = ("tokenizer.model", "tokenizer.json")


class ExperimentError(UserError, ValueError):
    """An experiment directory that cannot be used as asked; the message says what to do."""


def adopt_assets(config: ExperimentConfig, exp_dir: str | os.PathLike) -> ExperimentConfig:
    """Copies the tokenizer, CMVN statistics and memory plan a training config names into
    `exp_dir` (on the first run) or checks that they are still the ones it holds (on a
    resume); returns the config as the experiment records it: assets inside, shard
    directories absolute."""
    exp_dir = Path(exp_dir)
    data = config.data
    # every source checked before anything is copied: a missing one leaves no partial copy
    for key, source, target in (("data.cmvn", data.cmvn, exp_dir / CMVN_FILE),
                                ("data.plan", data.plan, exp_dir / PLAN_FILE)):  # fmt: skip
        if source:
            _check_source(Path(source), target, key)
    _adopt_tokenizer(Path(data.tokenizer), exp_dir / TOKENIZER_DIR)
    cmvn = None
    if data.cmvn:
        _adopt_file(Path(data.cmvn), exp_dir / CMVN_FILE, "data.cmvn")
        cmvn = CMVN_FILE
    plan = None
    if data.plan:
        _adopt_file(Path(data.plan), exp_dir / PLAN_FILE, "data.plan")
        plan = PLAN_FILE
    shards = {
        key: str(Path(value).resolve()) if value else value
        for key, value in (("train_shards", data.train_shards), ("dev_shards", data.dev_shards))
    }
    data = dataclasses.replace(data, tokenizer=TOKENIZER_DIR, cmvn=cmvn, plan=plan, **shards)
    return dataclasses.replace(config, data=data)


def _adopt_tokenizer(source: Path, target: Path) -> None:
    if source.resolve() == target.resolve():
        return
    for name in TOKENIZER_FILES:
        if not (source / name).is_file():
            raise FileNotFoundError(
                f"data.tokenizer: {source / name} missing (train one with `asrkit tokenizer "
                "train`, or point data.tokenizer at its directory)"
            )
    if target.exists():
        if not all(filecmp.cmp(source / n, target / n, shallow=False) for n in TOKENIZER_FILES):
            raise ExperimentError(
                f"data.tokenizer: {source} differs from the tokenizer this experiment was "
                f"trained with ({target}); train into a new --exp-dir, or fine-tune there with "
                "--init-from"
            )
        return
    tmp = target.with_name(target.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    for name in TOKENIZER_FILES:
        shutil.copy2(source / name, tmp / name)
    os.replace(tmp, target)


def _check_source(source: Path, target: Path, key: str) -> None:
    """A file an experiment adopts exists (or is its own copy already)."""
    if source.resolve() != target.resolve() and not source.is_file():
        raise FileNotFoundError(f"{key}: {source} missing")


def _adopt_file(source: Path, target: Path, key: str) -> None:
    _check_source(source, target, key)
    if source.resolve() == target.resolve():
        return
    if target.exists():
        if not filecmp.cmp(source, target, shallow=False):
            raise ExperimentError(
                f"{key}: {source} differs from the copy this experiment was trained with "
                f"({target}); train into a new --exp-dir"
            )
        return
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy2(source, target)


def load_experiment_config(
    exp_dir: str | os.PathLike, overrides: list[str] = ()
) -> ExperimentConfig:
    """An experiment's config (then `--set` overrides) with its tokenizer and CMVN paths
    resolved inside `exp_dir`."""
    exp_dir = Path(exp_dir)
    if not (exp_dir / CONFIG_FILE).is_file():
        raise FileNotFoundError(
            f"{exp_dir}: not an experiment directory (no {CONFIG_FILE}; made by asrkit train)"
        )
    path = exp_dir / CONFIG_FILE
    try:
        data = read_config_data(path)  # read once: checked, then built
    except ConfigError as err:
        raise ExperimentError(str(err)) from None
    _check_schema(path, data)
    return resolve_assets(config_from_data(data, overrides, path), exp_dir)


def _check_schema(path: Path, data) -> None:
    """A recorded config states its schema version; one that does not was recorded by an
    older asrkit, whose configs may mean other things."""
    if not isinstance(data, dict) or "schema" not in data:
        raise ExperimentError(
            f"{path}: recorded by an older asrkit (no schema version); decode it with that "
            "asrkit, or train anew (--init-from loads the weights that fit)"
        )


def resolve_assets(config: ExperimentConfig, exp_dir: str | os.PathLike) -> ExperimentConfig:
    """A recorded config with its (experiment-relative) tokenizer and CMVN paths made
    usable from any working directory."""
    exp_dir, data = Path(exp_dir), config.data
    resolved = dataclasses.replace(
        data,
        tokenizer=str(exp_dir / data.tokenizer),
        cmvn=str(exp_dir / data.cmvn) if data.cmvn else None,
        plan=str(exp_dir / data.plan) if data.plan else None,
    )
    return dataclasses.replace(config, data=resolved)


@dataclass(frozen=True)
class Experiment:
    """A trained experiment loaded for inference: the network with its weights, and what
    turns audio into its inputs and its outputs into text."""

    network: Transducer
    config: ExperimentConfig
    tokenizer: Tokenizer
    normalizer: GlobalNormalizer | None
    weights: str  # which weights: "ckpt-00000420", "average of ckpt-… (3)", or a path
    emission_delay: float = 0.0  # seconds; see `read_emission_delay`


def load_experiment(
    exp_dir: str | os.PathLike,
    checkpoint: str | os.PathLike | None = None,
    average: int = 1,
    chunk_frames: int | None = None,
    config: ExperimentConfig | None = None,
    precision: str | None = None,
) -> Experiment:
    """The network of an experiment with `checkpoint`'s weights if given, else the average
    of its last `average` checkpoints (1: the latest). No optimizer state is created.
    `chunk_frames`: for a Conformer trained with dynamic chunks, the chunk size to run
    with instead of `model.encoder.chunk_frames` (0: full context). `config`: the
    experiment's, already read (`load_experiment_config`), so that it is read once.
    `precision`: what the encoder runs in (`Transducer`'s `encoder_precision`)."""
    from asrkit.checkpoints import assign_weights, average_checkpoints, last_checkpoints, restore
    from asrkit.features import normalizer_for

    config = config or load_experiment_config(exp_dir)
    if chunk_frames is not None:
        check_chunk_override(config, chunk_frames)
    tokenizer = Tokenizer.load(config.data.tokenizer)
    network = build_network(config, tokenizer.vocab_size, precision)
    found = (
        [Path(checkpoint)] if checkpoint
        else last_checkpoints(Path(exp_dir) / "checkpoints", max(average, 1))
    )  # fmt: skip
    merged = adapted_weights(config)  # LoRA: the plain network, each update merged in
    if len(found) == 1 and merged is None:
        restore(network, found[0])
    else:
        assign_weights(network, average_checkpoints(found, merged))
    if checkpoint:
        weights = str(checkpoint)
    elif len(found) == 1:
        weights = found[0].name
    else:
        weights = f"average of {found[0].name}..{found[-1].name} ({len(found)})"
    if chunk_frames is not None:
        network.encoder.chunk_frames = int(chunk_frames)  # read when the graph is traced
    return Experiment(
        network, config, tokenizer, normalizer_for(config.data.cmvn), weights,
        read_emission_delay(exp_dir),
    )  # fmt: skip


def read_emission_delay(exp_dir: str | os.PathLike) -> float:
    """The emission delay `asrkit calibrate` measured for this experiment (0 if never)."""
    path = Path(exp_dir) / TIMING_FILE
    if not path.is_file():
        return 0.0
    try:
        return float(json.loads(path.read_text())["emission_delay_seconds"])
    except (ValueError, KeyError, TypeError) as error:
        raise ExperimentError(
            f"{path}: unreadable ({error}); delete it and run `asrkit calibrate` again"
        ) from None


@dataclass(frozen=True)
class TrainingLengths:
    """How long the utterances a model was trained on were: what a window of a long
    recording must not exceed (`asrkit transcribe`)."""

    max_seconds: float
    median_seconds: float | None = None
    utterances: int | None = None
    source: str = ""  # where the figures come from


def write_training_lengths(exp_dir: str | os.PathLike, lengths: TrainingLengths) -> Path:
    """Records the training lengths in the experiment (whole or not at all)."""
    path = Path(exp_dir) / TRAINING_LENGTHS_FILE
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(dataclasses.asdict(lengths), indent=1) + "\n")
    os.replace(tmp, path)
    return path


def read_training_lengths(exp_dir: str | os.PathLike) -> TrainingLengths | None:
    """The experiment's recorded training lengths, None if it has none (trained by an asrkit
    that did not record them)."""
    path = Path(exp_dir) / TRAINING_LENGTHS_FILE
    if not path.is_file():
        return None
    try:
        return TrainingLengths(**json.loads(path.read_text()))
    except (ValueError, TypeError) as error:
        raise ExperimentError(
            f"{path}: unreadable ({error}); delete it (windows then default to 30 s)"
        ) from None


def write_timing(exp_dir: str | os.PathLike, record: dict) -> Path:
    """Stores a calibration (`emission_delay_seconds` and how it was measured); written
    whole or not at all."""
    path = Path(exp_dir) / TIMING_FILE
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(record, indent=1) + "\n")
    os.replace(tmp, path)
    return path


def check_chunk_override(config: ExperimentConfig, chunk_frames: int) -> None:
    """`--chunk-frames`/`--lookahead-frames` is one the model was trained to run with."""
    encoder = config.model.encoder
    if encoder.lookaheads:
        if chunk_frames - 1 not in encoder.lookaheads:
            raise InputError(
                f"--lookahead-frames {chunk_frames - 1} (--chunk-frames {chunk_frames}): this "
                f"model was trained with the look-aheads {list(encoder.lookaheads)} (encoder "
                "frames; NeMo's att_context_size): pick one of them"
            )
        return
    if not encoder.dynamic_chunks:
        if encoder.kind != "conformer":
            trained = f"an {encoder.kind.upper()} encoder (it has no chunks)"
        elif encoder.chunk_frames:
            trained = f"chunks of {encoder.chunk_frames} frames only"
        else:
            trained = "full context only"
        raise InputError(
            f"--chunk-frames/--lookahead-frames: this model was trained with {trained}; "
            "running it with other chunks needs a Conformer trained with "
            "model.encoder.dynamic_chunks or several look-aheads (model.encoder.lookaheads)"
        )
    if chunk_frames < 0:
        raise InputError(f"--chunk-frames must be >= 0 (0: full context), got {chunk_frames}")


def adapted_weights(config: ExperimentConfig):
    """For an experiment trained through LoRA: checkpoint values -> the plain network's
    (`asrkit.models.adapters.merged_weights`); else None (values as they are: linear
    adapters are layers of the network)."""
    if config.model.adapters.kind != "lora":
        return None
    from asrkit.models.adapters import merged_weights

    return lambda values: merged_weights(values, config.model.adapters)


def build_network(
    config: ExperimentConfig, vocab_size: int, encoder_precision: str | None = None
) -> Transducer:
    """The transducer network a config describes, built (variables created);
    `encoder_precision`: inference only (`Transducer`)."""
    from asrkit.models.transducer import Transducer

    network = Transducer(vocab_size, config.model, encoder_precision, name="transducer")
    network.build_from_features(config.features.num_mel_bins)
    return network
