"""MultiWorkerMirroredStrategy: 2 worker processes on loopback == one union-batch update."""

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import keras
import numpy as np
import pytest

from tests.training.toy import assert_weights_close, make_batches, reference_run, windows_of

ROOT = Path(__file__).resolve().parents[2]
SIZES = [4, 6, 2, 8, 4, 6, 2]


def free_ports(n):
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


def run_workers(cmd, cwd, count=2, timeout=300, env=None):
    """Runs `cmd` as `count` MultiWorkerMirrored workers on loopback (TF_CONFIG per process);
    returns each worker's stdout, after asserting that all exited 0."""
    workers = [f"127.0.0.1:{p}" for p in free_ports(count)]
    procs = []
    for index in range(count):
        worker_env = dict(os.environ, **(env or {}), CUDA_VISIBLE_DEVICES="")
        worker_env["TF_CONFIG"] = json.dumps(
            {"cluster": {"worker": workers}, "task": {"type": "worker", "index": index}}
        )
        procs.append(subprocess.Popen([*cmd], cwd=cwd, env=worker_env, stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, text=True))  # fmt: skip
    outputs = []
    for proc in procs:
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            for p in procs:
                p.kill()
            raise
        assert proc.returncode == 0, err[-3000:]
        outputs.append(out)
    return outputs


@pytest.mark.parametrize("jit", [False, pytest.param(True, marks=pytest.mark.slow)])
def test_two_workers_equal_union_batch(tmp_path, jit):
    run_workers(
        [sys.executable, "-m", "tests.training.mwms_worker", str(tmp_path / "w{index}.npz"),
         ",".join(map(str, SIZES)), "3", *(["jit"] if jit else [])],
        cwd=ROOT, env={"PYTHONPATH": str(ROOT)},
    )  # fmt: skip
    results = [np.load(tmp_path / f"w{i}.npz") for i in range(2)]
    n_vars = sum(1 for k in results[0].files if k.startswith("final_"))
    initial = [results[0][f"initial_{i}"] for i in range(n_vars)]
    want, _ = reference_run(
        initial, windows_of(make_batches(SIZES), 3), keras.optimizers.AdamW(0.05, weight_decay=0.1)
    )
    for result in results:
        assert int(result["iterations"]) == 3
        assert_weights_close([result[f"final_{i}"] for i in range(n_vars)], want)


# --- `asrkit train --workers` as a user runs it, and faults -----------------------------

ASRKIT = Path(sys.executable).parent / "asrkit"


def start_workers(args, cwd, count=2):
    """`asrkit train ARGS --workers ... --worker-index i` for each i, as real processes."""
    workers = ",".join(f"127.0.0.1:{p}" for p in free_ports(count))
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="")
    return [
        subprocess.Popen(
            [ASRKIT, "train", *args, "--workers", workers, "--worker-index", str(i)],
            cwd=cwd,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i in range(count)
    ]


def finish(procs, timeout=300):
    """Each process's (returncode, stdout, stderr), all of them killed on a timeout."""
    results = []
    try:
        for proc in procs:
            out, err = proc.communicate(timeout=timeout)
            results.append((proc.returncode, out, err))
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
    return results
