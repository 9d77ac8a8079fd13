"""`train()`: the library function behind `asrkit-train`.

Reads shards, builds the Transducer under the chosen strategy and precision, trains with
exact accumulation, checkpoints every K updates and at each epoch end, resumes
automatically from the latest checkpoint (same data order: the pipeline is a function of
(seed, epoch) and the consumed micro-batches are skipped), and scores dev WER each epoch.
"""

from __future__ import annotations

import dataclasses
import math
import time
from dataclasses import dataclass
from pathlib import Path

import keras
import numpy as np
import tensorflow as tf

from asrkit import __version__
from asrkit.config import ExperimentConfig, dump_config
from asrkit.data.pipeline import PipelineConfig, bucket_plan, enough_frames, make_dataset
from asrkit.data.records import shard_counts
from asrkit.decoding.runner import decode_shards, normalizer_for
from asrkit.decoding.search import DecodeOptions
from asrkit.models.transducer import Transducer
from asrkit.tokenizer import Tokenizer
from asrkit.training.checkpoints import (
    CheckpointManager,
    TrainState,
    load_matching_weights,
    restore,
)
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
        return tf.distribute.MirroredStrategy()
    if name == "multiworker":
        return tf.distribute.MultiWorkerMirroredStrategy()
    gpus = tf.config.list_logical_devices("GPU")
    return tf.distribute.MirroredStrategy() if len(gpus) > 1 else tf.distribute.get_strategy()


def pipeline_config(config: ExperimentConfig) -> PipelineConfig:
    d = config.data
    return PipelineConfig(
        batch_seconds=d.batch_seconds,
        num_buckets=d.num_buckets,
        shuffle_buffer=d.shuffle_buffer,
        frame_step_seconds=config.features.frame_step / config.features.sample_rate,
        **({} if d.spec_augment else {"spec_augment": None}),
    )


def accumulation_steps(config: ExperimentConfig) -> int:
    t = config.train
    if t.effective_batch_seconds is None:
        return t.accumulation_steps
    return max(1, math.ceil(t.effective_batch_seconds / config.data.batch_seconds))


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
    exp_dir.mkdir(parents=True, exist_ok=True)
    (exp_dir / "config.yaml").write_text(f"# asrkit {__version__}\n" + dump_config(config))
    keras.utils.set_random_seed(config.train.seed)
    keras.mixed_precision.set_dtype_policy(config.train.precision)
    strategy = resolve_strategy(config.train.strategy)

    tokenizer = Tokenizer.load(config.data.tokenizer)
    normalize = normalizer_for(config)
    files, lengths, tokens = shard_counts(config.data.train_shards)
    dropped = int(np.sum(~enough_frames(lengths, tokens)))
    if dropped:
        log(f"{dropped} utterance(s) have fewer encoder frames than tokens and are skipped")
    pipe = pipeline_config(config)
    plan = bucket_plan(lengths, pipe)
    steps = accumulation_steps(config)
    micro_per_epoch = _micro_batches(lengths, plan)
    log(
        f"asrkit {__version__}: {len(lengths)} utterances ({lengths.sum() / 100 / 3600:.2f} h), "
        f"~{micro_per_epoch} micro-batches of <= {pipe.batch_seconds:.0f} s audio per epoch; "
        f"{steps} per update = effective batch {steps * pipe.batch_seconds:.0f} s audio "
        f"x {strategy.num_replicas_in_sync} replica(s)"
    )

    def dataset(epoch: int, skip: int = 0) -> tf.data.Dataset:
        return make_dataset(
            files, pipe, *plan, training=True, seed=config.train.seed, epoch=epoch,
            skip_batches=skip, num_mel_bins=config.features.num_mel_bins, normalize=normalize,
        )  # fmt: skip

    with strategy.scope():
        total_updates = config.train.epochs * math.ceil(micro_per_epoch / steps)
        model = build_model(config, tokenizer.vocab_size, steps, total_updates=total_updates)
        model.build_engine(next(iter(dataset(0))))
    parameters = sum(int(np.prod(v.shape)) for v in model.trainable_variables)
    log(f"model: {parameters:,} parameters, vocabulary {tokenizer.vocab_size}")

    manager = CheckpointManager(exp_dir / "checkpoints", config.train.keep_checkpoints)
    state = TrainState(epoch=0, micro_batches=0, updates=0)
    if manager.latest() is not None:
        state = restore(model, manager.latest())
        log(f"resumed from {manager.latest().name}: epoch {state.epoch}, {state.updates} updates")
    elif init_from:
        _init_from(model, init_from, log)

    writer = tf.summary.create_file_writer(str(exp_dir / "tensorboard"))
    dev_wer, epoch_losses = state.best_wer, []
    while state.epoch < config.train.epochs:
        progress = _Progress(manager, state, micro_per_epoch, config, writer, log)
        history = model.fit(
            dataset(state.epoch, state.micro_batches), verbose=0, callbacks=[progress]
        )
        epoch_losses += history.history.get("loss", [])[-1:]
        updates = int(model.optimizer.iterations.numpy())
        state = TrainState(state.epoch + 1, 0, updates, state.best_wer)
        if config.data.dev_shards:
            dev_wer = decode_shards(
                model, config.data.dev_shards, tokenizer, pipe, normalize,
                DecodeOptions(max_symbols_per_step=config.train.max_symbols_per_step),
                config.features.num_mel_bins,
            ).rates.wer  # fmt: skip
            best = dev_wer if state.best_wer is None else min(dev_wer, state.best_wer)
            state = dataclasses.replace(state, best_wer=best)
            with writer.as_default():
                tf.summary.scalar("dev/wer", dev_wer, step=updates)
            log(f"epoch {state.epoch}: dev WER {dev_wer * 100:.2f} %")
        manager.save(model, state)
    return TrainResult(state, dev_wer, parameters, time.monotonic() - start, epoch_losses)


def _micro_batches(lengths: np.ndarray, plan) -> int:
    boundaries, sizes = plan
    buckets = np.searchsorted(np.asarray(boundaries), lengths, side="right")
    counts = np.bincount(buckets, minlength=len(boundaries) + 1)
    return int(sum(math.ceil(c / s) for c, s in zip(counts, [*sizes, 1], strict=True)))


def _init_from(model, path: str, log) -> None:
    """Fine-tuning: weights from a checkpoint dir or an experiment dir (its latest); fresh
    optimizer; variables whose shape changed (a new tokenizer) keep their initialisation."""
    path = Path(path)
    if (path / "checkpoints").is_dir():
        path = CheckpointManager(path / "checkpoints").latest() or path
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


class _Progress(keras.callbacks.Callback):
    """Progress with ETA, TensorBoard scalars, and checkpoints every K updates."""

    def __init__(self, manager, state, total, config, writer, log):
        super().__init__()
        self.manager, self.state, self.total = manager, state, max(total, 1)
        self.every, self.writer, self.log = config.train.checkpoint_every, writer, log
        self.started = self.last_print = time.monotonic()
        self.first = state.micro_batches

    def on_train_batch_end(self, batch, logs=None):
        logs = logs or {}
        done = self.first + batch + 1  # Keras reports the last micro-batch of the window
        updates = int(self.model.optimizer.iterations.numpy())
        elapsed = time.monotonic() - self.started
        rate = (done - self.first) / max(elapsed, 1e-9)
        with self.writer.as_default():
            for key in ("loss", "window_loss", "grad_norm", "learning_rate", "skipped_windows"):
                if key in logs:
                    tf.summary.scalar(f"train/{key}", logs[key], step=updates)
            if "loss_scale" in logs:
                tf.summary.scalar("train/loss_scale", logs["loss_scale"], step=updates)
        now = time.monotonic()
        if now - self.last_print > 10:
            self.last_print = now
            eta = max(self.total - done, 0) / max(rate, 1e-9)
            self.log(
                f"epoch {self.state.epoch + 1} [{done}/{self.total}] updates {updates} "
                f"loss {logs.get('loss', float('nan')):.3f} lr {logs.get('learning_rate', 0):.2e} "
                f"grad {logs.get('grad_norm', 0):.2f} skipped {logs.get('skipped_windows', 0)} "
                f"eta {eta:.0f}s"
            )
        if self.every and updates and updates % self.every == 0:
            state = TrainState(self.state.epoch, done, updates, self.state.best_wer)
            self.manager.save(self.model, state)
