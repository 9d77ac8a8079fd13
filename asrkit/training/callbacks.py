"""The training loop's callback: progress (a bar on a terminal, log lines otherwise),
TensorBoard scalars, checkpoints every K updates, and stopping on request (a signal) at a
window boundary with a checkpoint."""

from __future__ import annotations

import dataclasses
import sys
import time

import keras
import tensorflow as tf

from asrkit.checkpoints import TrainState
from asrkit.progress import format_bar

_SCALARS = ("loss", "window_loss", "grad_norm", "learning_rate", "skipped_windows", "loss_scale")


class StopRequest:
    """Set by a signal handler; read by the training loop at window boundaries. With
    several workers, `agree` (flag -> any worker's flag) makes every worker stop at the same
    boundary when any of them was signalled."""

    def __init__(self, agree=None):
        self.signal: str | None = None
        self.agree = agree

    def requested(self) -> bool:
        """Whether to stop now; with several workers a collective call every worker makes
        at the same point."""
        if self.agree is not None and self.agree(self.signal is not None) and not self.signal:
            self.signal = "a signal to another worker"
        return self.signal is not None


class TrainingProgress(keras.callbacks.Callback):
    """One epoch's progress. `audio_per_micro_batch` is the epoch's mean audio seconds per
    micro-batch, so audio seconds per second is an epoch-average throughput."""

    def __init__(self, manager, state, total, audio_per_micro_batch, config, writer, log,
                 stream=None, stop: StopRequest | None = None):  # fmt: skip
        super().__init__()
        self.manager, self.state, self.total = manager, state, max(total, 1)
        self.audio_per_micro_batch = audio_per_micro_batch
        self.every, self.writer, self.log = config.train.checkpoint_every, writer, log
        self.stream = stream or sys.stderr
        self.bar = self.stream.isatty()
        self.started = self.last_print = time.monotonic()
        self.first = state.micro_batches
        self.stop = stop or StopRequest()
        self.stopped_at: TrainState | None = None  # where a stop request ended the epoch
        self.last_checkpoint = None

    def on_train_batch_end(self, batch, logs=None):
        logs = logs or {}
        done = self.first + batch + 1  # Keras reports the last micro-batch of the window
        updates = int(self.model.optimizer.iterations.numpy())
        elapsed = max(time.monotonic() - self.started, 1e-9)
        audio_rate = (done - self.first) * self.audio_per_micro_batch / elapsed
        with self.writer.as_default():
            for key in _SCALARS:
                if key in logs:
                    tf.summary.scalar(f"train/{key}", logs[key], step=updates)
            tf.summary.scalar("train/audio_seconds_per_second", audio_rate, step=updates)
        now = time.monotonic()
        if now - self.last_print > (0.5 if self.bar else 10):
            self.last_print = now
            self._report(done, updates, elapsed, audio_rate, logs)
        state = dataclasses.replace(self.state, micro_batches=done, updates=updates)
        stopping = self.stop.requested()
        if stopping or (self.every and updates and updates % self.every == 0):
            # Callbacks run at window boundaries only: a checkpoint never holds half a window.
            task = self.model
            self.last_checkpoint = self.manager.save(
                task.network, state, task.optimizer, heads=task.heads
            )
        if stopping:
            self.stopped_at = state
            self.model.stop_training = True

    def on_epoch_end(self, epoch, logs=None):
        if self.bar:
            self.stream.write("\n")
            self.stream.flush()

    def _report(self, done, updates, elapsed, audio_rate, logs) -> None:
        # The bar's rate counts this run's micro-batches only (a resumed epoch starts late).
        bar = format_bar(done - self.first, self.total - self.first, elapsed)
        line = (
            f"epoch {self.state.epoch + 1} {bar} updates {updates} "
            f"loss {logs.get('loss', float('nan')):.3f} lr {logs.get('learning_rate', 0):.2e} "
            f"grad {logs.get('grad_norm', 0):.2f} skipped {int(logs.get('skipped_windows', 0))} "
            f"{audio_rate:.0f} audio s/s"
        )
        if self.bar:
            self.stream.write("\r" + line)
            self.stream.flush()
        else:
            self.log(line)
