"""What building a training run takes, apart from running it: the strategy, the
accumulation steps, the learning-rate schedule, the task (network, adapters or frozen
blocks, loss, optimizer, engine), the process' seed and precision for its duration, and the
settings refused or cautioned against before training starts. `train()` (trainer.py) runs
them; `asrkit plan`, `verify-accumulation` and the memory meter build the same task."""

from __future__ import annotations

import contextlib
import functools
import math

import keras
import tensorflow as tf

from asrkit.config import ConfigError, ExperimentConfig
from asrkit.models.layers import dtype_policy
from asrkit.models.transducer import Transducer
from asrkit.training.adapting import apply_adapters
from asrkit.training.optimizers import build_optimizer
from asrkit.training.schedules import WarmupCosine, WarmupInverseSqrt
from asrkit.training.task import TransducerTask


def resolve_strategy(name: str) -> tf.distribute.Strategy:
    if name == "mirrored":
        # Every GPU; without GPUs, every logical CPU (one unless the process configured
        # more, as the tests do to emulate several devices).
        gpus = tf.config.list_logical_devices("GPU")
        devices = gpus or tf.config.list_logical_devices("CPU")
        return mirrored_strategy(tuple(d.name for d in devices))
    if name == "multiworker":
        return tf.distribute.MultiWorkerMirroredStrategy()
    gpus = tf.config.list_logical_devices("GPU")
    if len(gpus) > 1:
        return mirrored_strategy(tuple(d.name for d in gpus))
    return tf.distribute.get_strategy()


@functools.cache
def mirrored_strategy(devices: tuple[str, ...]) -> tf.distribute.MirroredStrategy:
    """One MirroredStrategy per set of devices for the whole process: a second instance
    numbers its collective operations from the same start, and its all-reduces then meet
    the first one's ("shape mismatch in the collective instance"), e.g. when a process
    trains twice."""
    return tf.distribute.MirroredStrategy(list(devices))


def accumulation_steps(
    config: ExperimentConfig, replicas: int = 1, micro_batch_seconds: float | None = None
) -> int:
    """`train.accumulation_steps`, or the micro-batches that make `effective_batch_seconds`
    when a micro-batch holds `micro_batch_seconds` of audio (padding included; default:
    `data.batch_seconds` on each of `replicas` devices; with a memory plan: its epoch mean)."""
    t = config.train
    if t.effective_batch_seconds is None:
        return t.accumulation_steps
    if micro_batch_seconds is None:
        micro_batch_seconds = config.data.batch_seconds * replicas
    return max(1, math.ceil(t.effective_batch_seconds / micro_batch_seconds))


def learning_rate_schedule(config: ExperimentConfig, total_updates: int):
    t = config.train
    if t.schedule == "cosine":
        return WarmupCosine(t.learning_rate, t.warmup_updates, total_updates, t.final_lr_ratio)
    return WarmupInverseSqrt(t.learning_rate, t.warmup_updates)


def build_task(
    config: ExperimentConfig,
    vocab_size: int,
    steps: int,
    optimizer=None,
    total_updates: int = 1,
) -> TransducerTask:
    """The training task (network + loss + accumulation engine), compiled."""
    check_trainable(config)
    t = config.train
    network = Transducer(vocab_size, config.model, name="transducer")
    freeze_encoder(network, t.freeze_encoder)
    apply_adapters(network, config)
    if optimizer is None:
        schedule = learning_rate_schedule(config, total_updates)
        optimizer = build_optimizer(
            t.optimizer, schedule, t.weight_decay, (t.adam_beta_1, t.adam_beta_2), t.adam_epsilon
        )
    task = TransducerTask(network, config.loss, name="transducer_task")
    task.compile(
        optimizer,
        accumulation_steps=steps,
        clip_global_norm=t.clip_global_norm,
        max_consecutive_skips=t.max_consecutive_skips,
        jit_compile=t.jit_compile,
    )
    return task


@contextlib.contextmanager
def process_settings(config: ExperimentConfig):
    """Seeds the random generators and sets the dtype policy for the duration of a run."""
    keras.utils.set_random_seed(config.train.seed)
    with dtype_policy(config.train.precision):
        yield


def check_trainable(config: ExperimentConfig) -> None:
    """Settings an imported model may carry that decode but do not train."""
    if config.loss.normalize_by == "none":
        raise ConfigError(
            "loss.normalize_by: none (an imported loss divided by no count, e.g. NeMo's "
            "rnnt_reduction: sum) cannot be trained with exact accumulation: a window's loss "
            "is divided by its count; choose one with --set loss.normalize_by=tokens "
            "(NeMo's mean_volume), utterances (mean_batch) or utterance_tokens (mean)"
        )


def config_cautions(config: ExperimentConfig) -> list[str]:
    """Settings that are valid but known to train badly, each with what to do instead."""
    cautions = []
    if config.loss.kind == "pruned" and config.model.predictor.kind == "lstm":
        cautions.append(
            "loss.kind=pruned with an LSTM predictor did not train on the mini recipe (test "
            "WER 74.8 % against 8.3 % with the full loss); pair it with "
            "model.predictor.kind=stateless, as icefall does"
        )
    if config.model.durations and 1 not in config.model.durations:
        cautions.append(
            f"model.durations {list(config.model.durations)} has no 1: an utterance whose "
            "encoder frames no sum of those durations makes has an infinite TDT loss, and its "
            "whole window is skipped; include 1 (NeMo uses [0, 1, 2, 3, 4])"
        )
    encoder = config.model.encoder
    if getattr(encoder, "conv_norm", None) == "batch":
        cautions.append(
            "model.encoder.conv_norm=batch normalises with each micro-batch's (and replica's) "
            "own statistics, as NeMo fine-tunes: an update from several micro-batches is then "
            "not the update from their union (only one micro-batch on one replica is); "
            "frozen_batch keeps accumulation exact"
        )
    return cautions


def freeze_encoder(network: Transducer, blocks: int) -> None:
    """blocks = -1: the whole encoder; n > 0: its subsampling and first n layers."""
    if blocks == 0:
        return
    encoder = network.encoder
    if blocks < 0:
        encoder.trainable = False
        return
    encoder.subsampling.trainable = False
    for layer in encoder.blocks[:blocks]:
        layer.trainable = False
