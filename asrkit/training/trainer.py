"""`train()`: the library function behind `asrkit-train`.

In named steps: open the experiment (copy the tokenizer and CMVN in, write the resolved
config), plan the data (shards, buckets, accumulation), build the training task under the
chosen strategy and precision, restore the latest checkpoint or initialise (fine-tuning),
run the epochs (checkpoints every K updates and at each epoch end, dev WER per epoch), and
finish. A resumed run continues the same data order: the pipeline is a function of
(seed, epoch) and the consumed micro-batches are skipped.

SIGTERM or SIGINT (a preemptible VM, a Slurm time limit, Ctrl-C) finishes the current
window — never half of one — writes a checkpoint and returns; a second one stops at once.

Process-global state: `train()` seeds Keras' random generators (Python, NumPy, TF) with
`train.seed` — left seeded, as any seeding is — and sets the Keras dtype policy to
`train.precision` only while it runs (the previous policy is restored).
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import shutil
import signal
import threading
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

import numpy as np
import tensorflow as tf

from asrkit import __version__
from asrkit.checkpoints import (
    BaseRef,
    CheckpointManager,
    LoadReport,
    TrainState,
    checkpoint_base,
    checkpoint_damage,
    list_checkpoints,
    load_matching_weights,
    restore,
    set_aside,
)
from asrkit.config import ExperimentConfig, dump_config
from asrkit.data.audio_shards import OnTheFly
from asrkit.data.batch_plan import mean_micro_batch_seconds, micro_batch_plan
from asrkit.data.order import (
    DataPlanKey,
    RecordIndex,
    changed_keys,
    index_bytes,
    micro_batches_per_epoch,
    shards_digest,
)
from asrkit.data.pipeline import (
    PipelineConfig,
    epoch_lengths,
    for_every_worker,
    index_shards,
    make_dataset,
    pipeline_config,
    prefetched_micro_batches,
)
from asrkit.data.records import check_shards, on_the_fly, shard_files, unreadable_of
from asrkit.decoding.recogniser import Recogniser
from asrkit.decoding.runner import decode_shards
from asrkit.errors import UserError
from asrkit.experiment import (
    CONFIG_FILE,
    TrainingLengths,
    adopt_assets,
    resolve_assets,
    write_training_lengths,
)
from asrkit.features import normalizer_for
from asrkit.models.transducer import Transducer
from asrkit.outputs import writable_directory
from asrkit.tokenizer import Tokenizer
from asrkit.training.adapting import from_base
from asrkit.training.callbacks import StopRequest, TrainingProgress
from asrkit.training.cluster import (
    DEFAULT_START_TIMEOUT,
    any_worker,
    cluster_of,
    meet,
    naming_a_lost_worker,
    settings_of,
    worker_role,
)
from asrkit.training.probe import largest_micro_batch, probe_memory
from asrkit.training.setup import (
    accumulation_steps,
    build_task,
    check_trainable,
    config_cautions,
    process_settings,
    resolve_strategy,
)
from asrkit.training.task import TransducerTask


@dataclass(frozen=True)
class TrainResult:
    state: TrainState
    dev_wer: float | None
    parameters: int
    seconds: float
    epoch_losses: list[float]  # Σ loss / Σ count of each epoch trained in this call
    stopped_by: str | None = None  # "SIGTERM" / "SIGINT" when a signal ended the run early
    checkpoint: Path | None = None  # the last checkpoint this call wrote


def train(
    config: ExperimentConfig,
    exp_dir: str | Path,
    init_from: str | None = None,
    log=print,
    new_epoch_order: bool = False,
    start_timeout: float = DEFAULT_START_TIMEOUT,
) -> TrainResult:
    """Trains (or resumes) the experiment in `exp_dir`. A resume whose data plan (shards,
    buckets, micro-batch sizes, seed) differs from the checkpoint's is refused, naming what
    changed, unless `new_epoch_order`: then the current epoch starts again in the new order
    (weights, optimizer and update count kept).

    `train.strategy=multiworker` with TF_CONFIG set: the workers meet first (every one within
    `start_timeout` seconds, with the same settings and experiment directory; see
    `asrkit.training.cluster`), and a worker lost during training ends the others with
    `WorkerLost`."""
    start = time.monotonic()
    check_trainable(config)
    for message in config_cautions(config):
        warnings.warn(message, stacklevel=2)
    cluster = cluster_of(config)
    if cluster is not None:
        meet(cluster, Path(exp_dir), settings_of(config), start_timeout)
    with process_settings(config), naming_a_lost_worker(cluster, Path(exp_dir)):
        strategy = resolve_strategy(config.train.strategy)
        run = _open_run(config, Path(exp_dir), strategy, log)
        data = _plan_data(run, strategy.num_replicas_in_sync)
        task = _build(run, data, strategy)
        if run.chief:
            _check_checkpoint_space(task, run)
        state, base = _restore_or_init(task, run, init_from)
        state = _check_data_plan(state, data, run.log, new_epoch_order)
        _record_config(run)  # only now: a refused resume leaves the experiment as it was
        _record_training_lengths(run, data)
        agree = any_worker(strategy) if cluster is not None else None
        try:
            with _stop_on_signals(run.log, agree) as stop:
                result = _run_epochs(task, run, data, state, stop, base)
            if agree is not None:
                # No worker leaves before every one is done (the chief's last checkpoint
                # included): one that left early would look lost to the others.
                agree(False)
        finally:
            if not run.chief:
                shutil.rmtree(run.save_dir, ignore_errors=True)
    return dataclasses.replace(result, seconds=time.monotonic() - start)


class _Run(NamedTuple):
    config: ExperimentConfig  # the recorded config's assets resolved inside exp_dir
    recorded: ExperimentConfig  # as config.yaml records it (assets relative to exp_dir)
    exp_dir: Path
    save_dir: Path  # where this process writes checkpoints
    chief: bool
    tokenizer: Tokenizer
    log: object


def _open_run(config: ExperimentConfig, exp_dir: Path, strategy, log) -> _Run:
    chief, worker = worker_role(strategy)
    # Every worker writes checkpoints (saving can need collectives), only the chief where
    # they are kept; the others write to a scratch directory and log nothing.
    save_dir = exp_dir if chief else exp_dir / f".worker-{worker}"
    created = not save_dir.exists()
    save_dir.mkdir(parents=True, exist_ok=True)
    recorded = config
    if chief:
        try:
            recorded = adopt_assets(config, exp_dir)
        except BaseException:
            if created:  # a run refused at the start leaves no experiment directory behind
                shutil.rmtree(save_dir, ignore_errors=True)
            raise
        config = resolve_assets(recorded, exp_dir)
    else:
        log = _silent
    tokenizer = Tokenizer.load(config.data.tokenizer)
    return _Run(config, recorded, exp_dir, save_dir, chief, tokenizer, log)


def _record_config(run: _Run) -> None:
    """config.yaml, written once the checkpoint (if any) and the data plan accepted this
    run's config: a resume refused for another architecture or data plan keeps the record."""
    if run.chief:
        text = f"# asrkit {__version__}\n" + dump_config(run.recorded)
        (run.exp_dir / CONFIG_FILE).write_text(text)


def _record_training_lengths(run: _Run, data: _TrainingData) -> None:
    """The lengths of the utterances trained on (the training shards' usable records): what
    `asrkit transcribe` keeps its windows within."""
    if not run.chief or not len(data.frames):
        return
    features = run.config.features
    seconds = data.frames * features.frame_step / features.sample_rate
    write_training_lengths(run.exp_dir, TrainingLengths(
        max_seconds=round(float(seconds.max()), 3),
        median_seconds=round(float(np.median(seconds)), 3), utterances=len(seconds),
        source=f"data.train_shards {run.config.data.train_shards}",
    ))  # fmt: skip


def _build(run: _Run, data: _TrainingData, strategy) -> TransducerTask:
    config = run.config
    with strategy.scope():
        total_updates = sum(
            math.ceil(data.micro_in(config, epoch) / data.steps)
            for epoch in range(config.train.epochs)
        )
        task = build_task(config, run.tokenizer.vocab_size, data.steps, total_updates=total_updates)
        task.build_engine(next(iter(_dataset(config, data, 0))))
    run.log(f"model: {_parameters(task):,} parameters, vocabulary {run.tokenizer.vocab_size}")
    if config.train.probe_memory:
        shape = largest_micro_batch(data.frames, data.tokens, data.plan, data.replicas)
        multiple = data.pipe.label_pad_multiple  # as the pipeline pads them
        shape = dataclasses.replace(shape, tokens=math.ceil(shape.tokens / multiple) * multiple)
        probe_memory(task, strategy, shape, config.features.num_mel_bins)
        run.log(
            f"memory probe: the largest micro-batch fits ({shape.utterances} utterance(s) x "
            f"{shape.frames} frames x {shape.tokens} tokens per replica)"
        )
    return task


def _check_checkpoint_space(task: TransducerTask, run: _Run) -> None:
    """Before the first update: room for two checkpoints (one written while the previous
    is kept), or one line naming the directory and the sizes."""
    weights = sum(int(np.prod(v.shape)) * np.dtype(v.dtype).itemsize for v in task.variables)
    slots = sum(
        int(np.prod(v.shape)) * np.dtype(v.dtype).itemsize for v in task.optimizer.variables
    )
    writable_directory(
        run.save_dir / "checkpoints", "--exp-dir", needed_bytes=2 * (weights + slots)
    )


def _restore_or_init(
    task: TransducerTask, run: _Run, init_from: str | None
) -> tuple[TrainState, BaseRef | None]:
    """The state to start from, and the base an adapted run's checkpoints take their
    frozen weights from (kept from the checkpoint resumed; None: they hold every weight)."""
    found = list_checkpoints(run.exp_dir / "checkpoints")  # the chief's, on every worker
    while found:
        latest = found.pop()
        damage = checkpoint_damage(latest)
        if damage is not None:
            # Resume from the newest intact one; the damaged one is kept (by the chief),
            # renamed so that it is never listed again.
            aside = set_aside(latest) if run.chief else latest
            warnings.warn(
                f"{damage}: resuming from the checkpoint before it "
                f"({found[-1].name if found else 'none: starting afresh'}); the damaged one "
                f"is kept as {aside}",
                stacklevel=2,
            )
            continue
        # Its files were just hashed: restore does not hash them a second time.
        state = restore(task.network, latest, task.optimizer, heads=task.heads, verified=True)
        run.log(f"resumed from {latest.name}: epoch {state.epoch}, {state.updates} updates")
        return state, checkpoint_base(latest)
    base = None
    if init_from:
        path, report = _init_from(task.network, init_from, run.log)
        if run.config.model.adapters.kind != "none":
            base = BaseRef.of(path, from_base(task.network, report.loaded))
            run.log(f"checkpoints hold the adapters; {len(base.names)} frozen weights are {path}'s")
    return TrainState(epoch=0, micro_batches=0, updates=0), base


class DataPlanChanged(UserError, ValueError):
    """A resume whose epoch order would not be the checkpoint's."""


def _check_data_plan(state: TrainState, data: _TrainingData, log, new_order: bool) -> TrainState:
    current = data.plan_key.as_dict()
    if state.data_plan is None or state.data_plan == current:
        return dataclasses.replace(state, data_plan=current)
    changed = changed_keys(DataPlanKey.from_dict(state.data_plan), data.plan_key)
    if not new_order:
        raise DataPlanChanged(
            f"epoch {state.epoch + 1} of this experiment was planned with other data settings "
            f"(changed: {'; '.join(changed)}), so resuming would continue a different order. "
            "Restore them, or pass --new-epoch-order to start this epoch again in the new order"
        )
    log(f"new epoch order ({'; '.join(changed)} changed): epoch {state.epoch + 1} starts again")
    return dataclasses.replace(state, micro_batches=0, data_plan=current)


def _run_epochs(
    task, run: _Run, data: _TrainingData, state: TrainState, stop, base: BaseRef | None
) -> TrainResult:
    config = run.config
    manager = CheckpointManager(
        run.save_dir / "checkpoints", config.train.keep_checkpoints, config.train.keep_best,
        base,
    )  # fmt: skip
    if run.chief:
        writer = tf.summary.create_file_writer(str(run.exp_dir / "tensorboard"))
    else:
        writer = tf.summary.create_noop_writer()
    dev_wer, epoch_losses, last = state.best_wer, [], None
    while state.epoch < config.train.epochs and not stop.requested():
        state = dataclasses.replace(state, dev_wer=None)  # mid-epoch weights have none
        progress = TrainingProgress(
            manager, state, data.micro_in(config, state.epoch), data.audio_per_micro_batch,
            config, writer,
            run.log, stop=stop,
        )  # fmt: skip
        history = task.fit(
            _dataset(config, data, state.epoch, state.micro_batches), verbose=0,
            callbacks=[progress],
        )  # fmt: skip
        if progress.stopped_at is not None:  # a signal: the window is done and saved
            state, last = progress.stopped_at, progress.last_checkpoint
            break
        epoch_losses += history.history.get("loss", [])[-1:]
        updates = int(task.optimizer.iterations.numpy())
        state = dataclasses.replace(state, epoch=state.epoch + 1, micro_batches=0,
                                    updates=updates)  # fmt: skip
        if config.data.dev_shards and run.chief:
            started = time.monotonic()
            dev_wer = _dev_wer(task.network, config, run.tokenizer, data)
            decoding = time.monotonic() - started
            best = dev_wer if state.best_wer is None else min(dev_wer, state.best_wer)
            state = dataclasses.replace(state, best_wer=best, dev_wer=dev_wer)
            with writer.as_default():
                tf.summary.scalar("dev/wer", dev_wer, step=updates)
            run.log(
                f"epoch {state.epoch}: dev WER {dev_wer * 100:.2f} % (greedy, {decoding:.1f} s)"
            )
        last = manager.save(task.network, state, task.optimizer, heads=task.heads)
    return TrainResult(state, dev_wer, _parameters(task), 0.0, epoch_losses, stop.signal, last)


def _parameters(task) -> int:
    return sum(int(np.prod(v.shape)) for v in task.trainable_variables)


@contextlib.contextmanager
def _stop_on_signals(log, agree=None):
    """SIGTERM/SIGINT set a flag the training loop reads at window boundaries; the first
    one also puts the previous handlers back, so a second one acts at once. `agree`: see
    `StopRequest`."""
    stop = StopRequest(agree)
    if threading.current_thread() is not threading.main_thread():
        yield stop  # signal handlers can only be installed from the main thread
        return
    previous = {}

    def handler(signum, _frame):
        stop.signal = signal.Signals(signum).name
        for sig, old in previous.items():
            signal.signal(sig, old)
        log(f"{stop.signal}: finishing the current window, then writing a checkpoint "
            "(send it again to stop at once)")  # fmt: skip

    for sig in (signal.SIGTERM, signal.SIGINT):
        previous[sig] = signal.signal(sig, handler)
    try:
        yield stop
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


class _TrainingData(NamedTuple):
    files: list[str]
    frames: np.ndarray  # per utterance (audio shards: at the slowest speed, what plans)
    tokens: np.ndarray  # per utterance
    pipe: PipelineConfig
    plan: tuple[list[int], list[int]]
    steps: int  # micro-batches per update
    replicas: int
    micro_per_epoch: int
    audio_per_micro_batch: float  # seconds, the epoch's mean
    normalize: object
    index: RecordIndex  # the usable records, by byte offset
    plan_key: DataPlanKey
    audio: OnTheFly | None  # audio shards: how their features are computed

    def micro_in(self, config: ExperimentConfig, epoch: int) -> int:
        """Micro-batches in `epoch` (audio shards: its speeds make its lengths)."""
        if self.audio is None:
            return self.micro_per_epoch
        lengths = epoch_lengths(
            self.index, self.audio, training=True, seed=config.train.seed, epoch=epoch
        )
        return micro_batches_per_epoch(lengths, self.plan)


def _plan_data(run: _Run, replicas: int) -> _TrainingData:
    config, log = run.config, run.log
    check_shards(config.data.train_shards, config, run.tokenizer)
    if config.data.dev_shards:
        check_shards(config.data.dev_shards, config, run.tokenizer)
    files = shard_files(config.data.train_shards)
    audio = on_the_fly(config.data.train_shards, config.features)
    # reads each side file once, and the record headers
    index = index_shards(files, config.model.encoder, config.data.train_shards, audio)
    if index.unusable:
        log(f"{index.unusable} utterance(s) have fewer encoder frames than tokens and are skipped")
    skipped = unreadable_of(config.data.train_shards)
    if skipped:
        where = f"{config.data.train_shards}/shards.json"
        log(f"{len(skipped)} utterance(s) were left out at extraction, their audio unreadable "
            f"(e.g. {next(iter(skipped))}; listed in {where})")  # fmt: skip
    frames, tokens = index.frames, index.tokens
    pipe = pipeline_config(config, replicas)
    plan = micro_batch_plan(config, frames, tokens, replicas)
    micro = micro_batches_per_epoch(frames, plan)
    seconds_total = float(frames.sum()) * pipe.frame_step_seconds
    if config.data.plan:
        seconds = mean_micro_batch_seconds(frames, plan, pipe.frame_step_seconds)
        log(
            f"memory plan {config.data.plan}: micro-batches of {plan[1]} utterance(s) for "
            f"buckets up to {[round((b - 1) * pipe.frame_step_seconds, 1) for b in plan[0]]} s"
        )
        sizes = f"{seconds:.0f} s audio on average (memory plan)"
    else:
        seconds = pipe.batch_seconds
        sizes = f"<= {config.data.batch_seconds:.0f} s audio x {replicas} replica(s)"
    steps = accumulation_steps(config, replicas, seconds)
    log(
        f"asrkit {__version__}: {len(frames)} utterances ({seconds_total / 3600:.2f} h"
        f"{', at the slowest speed' if audio is not None and len(audio.speeds) > 1 else ''}), "
        f"~{micro} micro-batches of {sizes} per epoch; {steps} per update = effective batch "
        f"{steps * seconds:.0f} s audio"
    )
    bins = config.features.num_mel_bins
    held = prefetched_micro_batches() * pipe.batch_seconds / pipe.frame_step_seconds * bins * 4
    log(
        f"input pipeline host memory: <= {(held + index_bytes(index)) / 2**20:.0f} MiB "
        f"({prefetched_micro_batches()} micro-batches in flight + the record index; "
        "no shuffle buffer)"
    )
    normalize = normalizer_for(config.data.cmvn)
    key = DataPlanKey(shards_digest(files), tuple(plan[0]), tuple(plan[1]), config.train.seed)
    return _TrainingData(
        files, frames, tokens, pipe, plan, steps, replicas, micro, seconds_total / micro,
        normalize, index, key, audio,
    )  # fmt: skip


def _dataset(config: ExperimentConfig, data: _TrainingData, epoch: int, skip: int = 0):
    dataset = make_dataset(
        data.files, data.pipe, *data.plan, training=True, seed=config.train.seed, epoch=epoch,
        skip_batches=skip, num_mel_bins=config.features.num_mel_bins, normalize=data.normalize,
        index=data.index, audio=data.audio,
    )  # fmt: skip
    return for_every_worker(dataset)


def _dev_wer(network, config: ExperimentConfig, tokenizer, data: _TrainingData) -> float:
    options = dataclasses.replace(config.decode, method="greedy")  # the dev WER's search
    recogniser = Recogniser.of_network(network, tokenizer, config, data.normalize, options)
    report = decode_shards(recogniser, config.data.dev_shards, tokenizer, data.pipe)
    return report.rates.wer


def _silent(*_args) -> None:
    pass


def _init_from(network: Transducer, path: str, log) -> tuple[Path, LoadReport]:
    """Fine-tuning: weights from a checkpoint dir or an experiment dir (its latest); fresh
    optimizer; variables whose shape changed (a new tokenizer) keep their initialisation."""
    path = Path(path)
    if (path / "checkpoints").is_dir():  # read-only: never sweep another run's directory
        found = list_checkpoints(path / "checkpoints")
        if not found:
            raise FileNotFoundError(f"--init-from {path}: the experiment has no checkpoint yet")
        path = found[-1]
    elif not path.is_dir():
        raise FileNotFoundError(f"--init-from {path}: no such experiment or checkpoint directory")
    report = load_matching_weights(network, path)
    log(f"initialised {len(report.loaded)} variables from {path} (fresh optimizer)")
    for name, why in report.skipped:
        log(f"  not loaded: {name}: {why}")
    for name in report.fresh:
        log(f"  not in the checkpoint, left fresh: {name}")
    for name in report.unused:
        log(f"  in the checkpoint, not in this model: {name}")
    return path, report
