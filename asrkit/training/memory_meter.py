"""Peak device memory of one training step at a given micro-batch shape, measured in a
child process.

The child builds the training task as `asrkit train` does (weights, AdamW slots, the
accumulation buffers), then for each requested shape runs the step twice (the first run
traces and warms up) and reports TensorFlow's allocator peak of the second, counted from
what was allocated before it (so weights, slots and buffers are included). A child because:
the CPU's BFC allocator (whose statistics are the ones a GPU's allocator keeps) must be
chosen before TensorFlow starts; a GPU can be given a smaller logical memory limit there to
emulate a smaller card; and an out-of-memory error cannot leave the caller's process in a
bad state.

A shape's peak is not one number: it moves by up to ~15 % either way with the shapes
measured before it and between processes (measured on a small Conformer, one op at a time):
the allocator counts a chunk whole even when the request is up to half smaller, and which
free chunks exist depends on what ran before. Training runs its shapes in mixed order, so
the same holds there; that is what the plan's safety margin is for.

Protocol: the parent writes one JSON request per line ({"utterances", "frames", "tokens"});
the child answers one line per request, prefixed with `RESULT `: {"peak": bytes} or
{"oom": true}.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

from asrkit.config import ExperimentConfig, dump_config
from asrkit.errors import UserError

_PREFIX = "RESULT "
# TensorFlow's native start-up logging (absl), which says nothing about why a child ended.
_TF_LOG = re.compile(r"^([IWE]\d{4} |WARNING: All log messages|To enable the following)|^\s*$")


class MeterError(UserError, RuntimeError):
    """The measuring process could not start or died; the message carries its last words."""


class MemoryMeter:
    """`with MemoryMeter(config, vocab_size, "CPU:0") as meter: meter.peak(n, frames, tokens)`
    -> bytes, or None when the step ran out of memory (GPU, or a limit given)."""

    def __init__(
        self,
        config: ExperimentConfig,
        vocab_size: int,
        device: str = "CPU:0",
        memory_limit: int | None = None,
    ):
        self.config, self.vocab_size, self.device = config, vocab_size, device
        self.memory_limit = memory_limit
        self._process = None
        self._dir = None

    def __enter__(self) -> MemoryMeter:
        self._dir = tempfile.TemporaryDirectory(prefix="asrkit-meter-")
        config_path = Path(self._dir.name) / "config.yaml"
        config_path.write_text(dump_config(self.config))
        self._log = open(Path(self._dir.name) / "stderr.txt", "w+")
        env = {
            **os.environ,
            "TF_CPU_ALLOCATOR_USE_BFC": "true",
            "TF_CPP_MIN_LOG_LEVEL": "2",
        }
        args = [sys.executable, "-m", __name__, str(config_path), str(self.vocab_size),
                self.device, str(self.memory_limit or 0)]  # fmt: skip
        self._process = subprocess.Popen(
            args, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._log, text=True,
            env=env,
        )  # fmt: skip
        self.baseline = self._answer()["baseline"]
        return self

    def peak(self, utterances: int, frames: int, tokens: int) -> int | None:
        request = {"utterances": int(utterances), "frames": int(frames), "tokens": int(tokens)}
        self._process.stdin.write(json.dumps(request) + "\n")
        self._process.stdin.flush()
        answer = self._answer()
        return None if answer.get("oom") else int(answer["peak"])

    def _answer(self) -> dict:
        for line in self._process.stdout:
            if line.startswith(_PREFIX):
                return json.loads(line[len(_PREFIX) :])
        self._process.wait()
        self._log.seek(0)
        said = [line for line in self._log.read().splitlines() if not _TF_LOG.match(line)]
        raise MeterError(
            f"the memory-measuring process ended (exit {self._process.returncode}) on "
            f"{self.device}: " + (" | ".join(said[-3:]) or "no message")
        )

    def __exit__(self, *_exc):
        if self._process is not None:
            self._process.stdin.close()
            try:
                self._process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self._process.kill()
        self._log.close()
        self._dir.cleanup()


def _serve(config_path: str, vocab_size: int, device: str, memory_limit: int) -> None:
    import tensorflow as tf

    from asrkit.config import load_config
    from asrkit.training.probe import fabricated_batch, forward_backward
    from asrkit.training.setup import build_task, process_settings

    tf.config.threading.set_inter_op_parallelism_threads(1)
    kind = device.split(":")[0].upper()
    if kind == "GPU":
        gpus = tf.config.list_physical_devices("GPU")
        index = int(device.split(":")[1]) if ":" in device else 0
        if index >= len(gpus):
            raise SystemExit(f"no {device} here ({len(gpus)} GPU(s))")
        if memory_limit:  # emulate a smaller card: a logical device with this limit
            limit = tf.config.LogicalDeviceConfiguration(memory_limit=memory_limit // 2**20)
            tf.config.set_logical_device_configuration(gpus[index], [limit])
        else:
            tf.config.experimental.set_memory_growth(gpus[index], True)
    config = load_config(config_path)
    with process_settings(config), tf.device(device):
        task = build_task(config, vocab_size, steps=2)
        example = fabricated_batch(1, 16, 1, config.features.num_mel_bins)
        task.build_engine(example)
        step = forward_backward(
            task, jit_compile=config.train.jit_compile, num_mel_bins=config.features.num_mel_bins
        )
        baseline = tf.config.experimental.get_memory_info(device)["current"]
        _reply({"baseline": baseline})
        for line in sys.stdin:
            request = json.loads(line)
            batch = fabricated_batch(
                request["utterances"], request["frames"], request["tokens"],
                config.features.num_mel_bins,
            )  # fmt: skip
            try:
                step(batch)
                # What the step itself takes on top of the model's lasting state (caches a
                # previous shape left behind are not this shape's).
                _reply({"peak": baseline + allocator_peak(lambda b=batch: step(b), device)})
            except tf.errors.ResourceExhaustedError:
                _reply({"oom": True})


def allocator_peak(run, device: str = "CPU:0") -> int:
    """Bytes TensorFlow's allocator held at its peak during `run()` above what it held
    before (the tensors `run` made; on a CPU only with `TF_CPU_ALLOCATOR_USE_BFC=true`
    set before TensorFlow started). The one memory measurement of asrkit and its tools."""
    import tensorflow as tf

    tf.config.experimental.reset_memory_stats(device)
    before = tf.config.experimental.get_memory_info(device)["current"]
    run()
    return tf.config.experimental.get_memory_info(device)["peak"] - before


def _reply(answer: dict) -> None:
    sys.stdout.write(_PREFIX + json.dumps(answer) + "\n")
    sys.stdout.flush()


if __name__ == "__main__":
    _serve(sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4]))
