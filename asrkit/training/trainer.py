"""`train()`: the library function behind `asrkit-train`.

Reads shards, builds the Transducer under the chosen strategy and precision, trains with
exact accumulation, checkpoints every K updates and at each epoch end, resumes
automatically from the latest checkpoint (same data order: the pipeline is a function of
(seed, epoch) and the consumed micro-batches are skipped), and scores dev WER each epoch.
"""

from __future__ import annotations

import dataclasses
import math
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

import keras
import numpy as np
import tensorflow as tf

from asrkit import __version__
from asrkit.config import ExperimentConfig, dump_config
from asrkit.data.pipeline import (
    PipelineConfig,
    bucket_index,
    bucket_plan,
    enough_frames,
    make_dataset,
)
from asrkit.data.records import shard_counts
from asrkit.decoding.runner import decode_shards, normalizer_for
from asrkit.decoding.search import DecodeOptions
from asrkit.models.transducer import Transducer
from asrkit.tokenizer import Tokenizer
from asrkit.training.callbacks import TrainingProgress
from asrkit.training.checkpoints import (
    CheckpointManager,
    TrainState,
    list_checkpoints,
    load_matching_weights,
    restore,
)
from asrkit.training.probe import largest_micro_batch, probe_memory
from asrkit.training.schedules import WarmupCosine, WarmupInverseSqrt


@dataclass(frozen=True)
class TrainResult:
    state: TrainState
    dev_wer: float | None
    parameters: int
    seconds: float
    epoch_losses: list[float]  # Σ loss / Σ count of each epoch trained in this call


def resolve_strategy(name: str) -> tf.distribute.Strategy:
    if name == "mirrored":
        # Every GPU; without GPUs, every logical CPU (one unless the process configured
        # more, as the tests do to emulate several devices).
        gpus = tf.config.list_logical_devices("GPU")
        devices = gpus or tf.config.list_logical_devices("CPU")
        return tf.distribute.MirroredStrategy([d.name for d in devices])
    if name == "multiworker":
        return tf.distribute.MultiWorkerMirroredStrategy()
    gpus = tf.config.list_logical_devices("GPU")
    return tf.distribute.MirroredStrategy() if len(gpus) > 1 else tf.distribute.get_strategy()


def pipeline_config(config: ExperimentConfig, replicas: int = 1) -> PipelineConfig:
    """The input pipeline; a global micro-batch holds `data.batch_seconds` per replica."""
    d = config.data
    return PipelineConfig(
        batch_seconds=d.batch_seconds * replicas,
        num_buckets=d.num_buckets,
        shuffle_buffer=d.shuffle_buffer,
        frame_step_seconds=config.features.frame_step / config.features.sample_rate,
        **({} if d.spec_augment else {"spec_augment": None}),
    )


def accumulation_steps(config: ExperimentConfig, replicas: int = 1) -> int:
    """`train.accumulation_steps`, or the micro-batches that make `effective_batch_seconds`
    when each of `replicas` devices holds `data.batch_seconds` of audio."""
    t = config.train
    if t.effective_batch_seconds is None:
        return t.accumulation_steps
    return max(1, math.ceil(t.effective_batch_seconds / (config.data.batch_seconds * replicas)))


def learning_rate_schedule(config: ExperimentConfig, total_updates: int):
    t = config.train
    if t.schedule == "cosine":
        return WarmupCosine(t.learning_rate, t.warmup_updates, total_updates, t.final_lr_ratio)
    return WarmupInverseSqrt(t.learning_rate, t.warmup_updates)


def build_model(
    config: ExperimentConfig,
    vocab_size: int,
    steps: int,
    optimizer=None,
    total_updates: int = 1,
) -> Transducer:
    t = config.train
    model = Transducer(vocab_size, config.model, name="transducer")
    freeze_encoder(model, t.freeze_encoder)
    if optimizer is None:
        schedule = learning_rate_schedule(config, total_updates)
        optimizer = keras.optimizers.AdamW(schedule, weight_decay=t.weight_decay)
    model.compile(
        optimizer,
        accumulation_steps=steps,
        clip_global_norm=t.clip_global_norm,
        max_consecutive_skips=t.max_consecutive_skips,
        jit_compile=t.jit_compile,
    )
    return model


def train(
    config: ExperimentConfig, exp_dir: str | Path, init_from: str | None = None, log=print
) -> TrainResult:
    start = time.monotonic()
    exp_dir = Path(exp_dir)
    keras.utils.set_random_seed(config.train.seed)
    keras.mixed_precision.set_dtype_policy(config.train.precision)
    strategy = resolve_strategy(config.train.strategy)
    chief, worker = _worker_role(strategy)
    # Every worker writes checkpoints (saving can need collectives), only the chief where
    # they are kept; the others write to a scratch directory and log nothing.
    save_dir = exp_dir if chief else exp_dir / f".worker-{worker}"
    save_dir.mkdir(parents=True, exist_ok=True)
    if chief:
        (exp_dir / "config.yaml").write_text(f"# asrkit {__version__}\n" + dump_config(config))
    else:
        log = _silent
    replicas = strategy.num_replicas_in_sync

    tokenizer = Tokenizer.load(config.data.tokenizer)
    data = _plan_data(config, replicas, log)
    steps, micro_per_epoch = data.steps, data.micro_per_epoch

    def dataset(epoch: int, skip: int = 0) -> tf.data.Dataset:
        return _dataset(config, data, epoch, skip)

    with strategy.scope():
        total_updates = config.train.epochs * math.ceil(micro_per_epoch / steps)
        model = build_model(config, tokenizer.vocab_size, steps, total_updates=total_updates)
        model.build_engine(next(iter(dataset(0))))
    parameters = sum(int(np.prod(v.shape)) for v in model.trainable_variables)
    log(f"model: {parameters:,} parameters, vocabulary {tokenizer.vocab_size}")

    if config.train.probe_memory:
        shape = largest_micro_batch(data.frames, data.tokens, data.plan, replicas)
        probe_memory(model, strategy, shape, config.features.num_mel_bins)
        log(
            f"memory probe: the largest micro-batch fits ({shape.utterances} utterance(s) x "
            f"{shape.frames} frames x {shape.tokens} tokens per replica)"
        )
    manager = CheckpointManager(save_dir / "checkpoints", config.train.keep_checkpoints)
    state = TrainState(epoch=0, micro_batches=0, updates=0)
    found = list_checkpoints(exp_dir / "checkpoints")  # the chief's, on every worker
    if found:
        state = restore(model, found[-1])
        log(f"resumed from {found[-1].name}: epoch {state.epoch}, {state.updates} updates")
    elif init_from:
        _init_from(model, init_from, log)

    if chief:
        writer = tf.summary.create_file_writer(str(exp_dir / "tensorboard"))
    else:
        writer = tf.summary.create_noop_writer()
    dev_wer, epoch_losses = state.best_wer, []
    while state.epoch < config.train.epochs:
        progress = TrainingProgress(
            manager, state, micro_per_epoch, data.audio_per_micro_batch, config, writer, log
        )
        history = model.fit(
            dataset(state.epoch, state.micro_batches), verbose=0, callbacks=[progress]
        )
        epoch_losses += history.history.get("loss", [])[-1:]
        updates = int(model.optimizer.iterations.numpy())
        state = TrainState(state.epoch + 1, 0, updates, state.best_wer)
        if config.data.dev_shards and chief:
            dev_wer = _dev_wer(model, config, tokenizer, data)
            best = dev_wer if state.best_wer is None else min(dev_wer, state.best_wer)
            state = dataclasses.replace(state, best_wer=best)
            with writer.as_default():
                tf.summary.scalar("dev/wer", dev_wer, step=updates)
            log(f"epoch {state.epoch}: dev WER {dev_wer * 100:.2f} %")
        manager.save(model, state)
    if not chief:
        shutil.rmtree(save_dir, ignore_errors=True)
    return TrainResult(state, dev_wer, parameters, time.monotonic() - start, epoch_losses)


class _TrainingData(NamedTuple):
    files: list[str]
    frames: np.ndarray  # per utterance
    tokens: np.ndarray  # per utterance
    pipe: PipelineConfig
    plan: tuple[list[int], list[int]]
    steps: int  # micro-batches per update
    micro_per_epoch: int
    audio_per_micro_batch: float  # seconds, the epoch's mean
    normalize: object


def _plan_data(config: ExperimentConfig, replicas: int, log) -> _TrainingData:
    files, frames, tokens = shard_counts(config.data.train_shards)
    dropped = int(np.sum(~enough_frames(frames, tokens)))
    if dropped:
        log(f"{dropped} utterance(s) have fewer encoder frames than tokens and are skipped")
    pipe = pipeline_config(config, replicas)
    plan = bucket_plan(frames, pipe)
    steps = accumulation_steps(config, replicas)
    micro = _micro_batches(frames, plan)
    audio = float(frames.sum()) * pipe.frame_step_seconds
    log(
        f"asrkit {__version__}: {len(frames)} utterances ({audio / 3600:.2f} h), "
        f"~{micro} micro-batches of <= {config.data.batch_seconds:.0f} s audio "
        f"x {replicas} replica(s) per epoch; {steps} per update = effective batch "
        f"{steps * pipe.batch_seconds:.0f} s audio"
    )
    normalize = normalizer_for(config)
    return _TrainingData(files, frames, tokens, pipe, plan, steps, micro, audio / micro, normalize)


def _dataset(config: ExperimentConfig, data: _TrainingData, epoch: int, skip: int):
    dataset = make_dataset(
        data.files, data.pipe, *data.plan, training=True, seed=config.train.seed, epoch=epoch,
        skip_batches=skip, num_mel_bins=config.features.num_mel_bins, normalize=data.normalize,
    )  # fmt: skip
    # Every worker reads the same global micro-batches and takes its slice of each, so all
    # workers run the same number of steps (file sharding would not).
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.DATA
    return dataset.with_options(options)


def _dev_wer(model, config: ExperimentConfig, tokenizer, data: _TrainingData) -> float:
    options = DecodeOptions(max_symbols_per_step=config.train.max_symbols_per_step)
    report = decode_shards(
        model, config.data.dev_shards, tokenizer, data.pipe, data.normalize, options,
        config.features.num_mel_bins,
    )  # fmt: skip
    return report.rates.wer


def _worker_role(strategy) -> tuple[bool, int]:
    """(is this process the chief, its task index) — single-process strategies: (True, 0)."""
    resolver = getattr(strategy, "cluster_resolver", None)
    if resolver is None or not resolver.task_type:
        return True, 0
    jobs = resolver.cluster_spec().jobs
    task_type, task_id = resolver.task_type, int(resolver.task_id or 0)
    if "chief" in jobs:
        return task_type == "chief", task_id
    return task_type == "worker" and task_id == 0, task_id


def _silent(*_args) -> None:
    pass


def _micro_batches(lengths: np.ndarray, plan) -> int:
    boundaries, sizes = plan
    buckets = bucket_index(lengths, boundaries)
    counts = np.bincount(buckets, minlength=len(boundaries) + 1)
    return int(sum(math.ceil(c / s) for c, s in zip(counts, [*sizes, 1], strict=True)))


def _init_from(model, path: str, log) -> None:
    """Fine-tuning: weights from a checkpoint dir or an experiment dir (its latest); fresh
    optimizer; variables whose shape changed (a new tokenizer) keep their initialisation."""
    path = Path(path)
    if (path / "checkpoints").is_dir():  # read-only: never sweep another run's directory
        found = list_checkpoints(path / "checkpoints")
        path = found[-1] if found else path
    report = load_matching_weights(model, path)
    log(f"initialised {len(report.loaded)} variables from {path} (fresh optimizer)")
    for name, why in report.skipped:
        log(f"  not loaded: {name}: {why}")


def freeze_encoder(model: Transducer, blocks: int) -> None:
    """blocks = -1: the whole encoder; n > 0: its subsampling and first n layers."""
    if blocks == 0:
        return
    encoder = model.encoder
    if blocks < 0:
        encoder.trainable = False
        return
    encoder.subsampling.trainable = False
    layers = getattr(encoder, "blocks", None) or getattr(encoder, "lstms", [])
    for layer in layers[:blocks]:
        layer.trainable = False
