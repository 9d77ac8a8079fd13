"""What the benchmarks share: one child-process launcher with one environment, and one way
to repeat a measurement and report it (median and range).

Every measurement that must not see the others' memory or compiled graphs runs in a fresh
child process (`run_child`), with TensorFlow's BFC allocator switched on for the CPU so that
`asrkit.training.memory_meter.allocator_peak` reads a step's exact tensor peak — the method
`asrkit plan` uses (docs/memory.md). A tool calls `child_request(args)` first: in a child it
returns the request the parent sent, in the parent None.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from typing import NamedTuple

# The one environment of every measuring child: TensorFlow quiet, the BFC allocator on the
# CPU (exact peaks), oneDNN's own caching pool off, one malloc arena.
CHILD_ENV = {
    "TF_CPP_MIN_LOG_LEVEL": "3",
    "TF_CPU_ALLOCATOR_USE_BFC": "true",
    "TF_ENABLE_ONEDNN_OPTS": "0",
    "MALLOC_ARENA_MAX": "1",
}
# How the asrkit commands run TensorFlow: the BFC allocator on, oneDNN's kernels on (its
# default). For times; exact tensor peaks come from CHILD_ENV.
AS_COMMANDS_RUN = {"TF_ENABLE_ONEDNN_OPTS": "1"}
_FLAG = "--child-request"


def run_child(script: str, request: dict, timeout: float | None = None, env: dict | None = None):
    """Runs `script` in a fresh process with `request`; returns what the child passed to
    `reply` (a RuntimeError with the child's last stderr lines if it failed). `env`: changes
    to the measuring environment (e.g. oneDNN on, as the commands run)."""
    proc = subprocess.run(
        [sys.executable, script, _FLAG, json.dumps(request)], capture_output=True, text=True,
        env={**os.environ, **CHILD_ENV, **(env or {})}, timeout=timeout,
    )  # fmt: skip
    if proc.returncode != 0:
        raise RuntimeError(f"{script} child failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def child_request(argv: list[str] | None = None) -> dict | None:
    """In a child started by `run_child`: its request; in the parent: None."""
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) == 2 and argv[0] == _FLAG:
        return json.loads(argv[1])
    return None


def reply(answer) -> None:
    """A child's answer to `run_child` (the last line it prints)."""
    sys.stdout.write(json.dumps(answer) + "\n")
    sys.stdout.flush()


class Spread(NamedTuple):
    """Repeated measurements of one figure: their median and range."""

    median: float
    low: float
    high: float

    def format(self, spec: str = ".4f") -> str:
        """'median (low-high)'."""
        return f"{self.median:{spec}} ({self.low:{spec}}-{self.high:{spec}})"


def spread(values) -> Spread:
    values = list(values)
    return Spread(statistics.median(values), min(values), max(values))


def update_times(task, dataset, updates: int, warmup: int = 1) -> Spread:
    """Wall seconds of each of `updates` optimizer updates inside one `fit` epoch, as
    training runs them (`dataset`: one window's micro-batches, repeated here), from Keras'
    batch-begin to its batch-end callback, after `warmup` untimed updates of the same epoch
    (the first traces the step). What a `fit` call costs once, not per update, is
    left out: its set-up and its end."""
    import keras

    times = []

    class Clock(keras.callbacks.Callback):
        def on_train_batch_begin(self, batch, logs=None):
            self.start = time.perf_counter()

        def on_train_batch_end(self, batch, logs=None):
            times.append(time.perf_counter() - self.start)

    task.fit(dataset.repeat(warmup + updates), verbose=0, callbacks=[Clock()])
    if len(times) != warmup + updates:
        raise RuntimeError(f"update_times: {len(times)} updates ran, {warmup + updates} expected")
    return spread(times[warmup:])


def timed(fn, repeats: int = 3, warmup: int = 1) -> Spread:
    """Wall seconds of `fn()` over `repeats` calls after `warmup` untimed ones (tracing,
    caches)."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return spread(times)
