"""Training on several machines: the worker list a user types, the TF_CONFIG TensorFlow's
MultiWorkerMirroredStrategy reads, and a start-up meeting of the workers before TensorFlow
connects them.

TensorFlow, once it starts connecting workers, waits for a missing one without end and
holds the interpreter while it waits; nothing can time it out from inside the process. So
the workers first meet over a plain TCP connection to the chief's own port (the first
address; TensorFlow takes the port over afterwards): every worker says which worker list
and settings it was started with, the chief checks that all agree and that each of them
sees the file it writes into the experiment directory (so that directory is shared), and
answers every worker with one verdict. A worker that does not come within the start-up
timeout is named, and so is the first setting or list that differs.

Once training runs, a worker that dies is TensorFlow's to notice (its coordination service
misses the heartbeats, about 10 s, or the connection drops): the others' next collective
fails, and `lost_worker` turns that error into one line naming the worker.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import re
import secrets
import socket
import time
from dataclasses import dataclass
from pathlib import Path

from asrkit.errors import UserError

DEFAULT_START_TIMEOUT = 300.0
MARKER = ".asrkit-shared-check"
_POLL = 0.2  # seconds between connection attempts and accept checks


class ClusterError(UserError, RuntimeError):
    """The workers cannot start together: one missing, started differently, or not sharing
    the experiment directory."""


class WorkerLost(UserError, RuntimeError):
    """A worker stopped answering during training; rerunning the same commands resumes."""

    exit_code = 3  # not bad input: a scheduler may simply run the job again


@dataclass(frozen=True)
class Cluster:
    workers: tuple[str, ...]  # host:port of every worker; the first is the chief
    index: int  # this process's place in `workers`
    # TensorFlow's names: the chief its own `chief` task (a scheduler's TF_CONFIG), or
    # `worker` 0 like the others (--workers)
    chief_task: bool = False

    @property
    def chief(self) -> bool:
        return self.index == 0

    def name(self, index: int) -> str:
        return f"worker {index} ({self.workers[index]})"

    def tf_config(self) -> str:
        """The TF_CONFIG of this worker (`cluster_from_tf_config` reads it back)."""
        if not self.chief_task:
            jobs, task = {"worker": list(self.workers)}, ("worker", self.index)
        else:
            jobs = {"chief": list(self.workers[:1]), "worker": list(self.workers[1:])}
            task = ("chief", 0) if self.chief else ("worker", self.index - 1)
        return json.dumps({"cluster": jobs, "task": {"type": task[0], "index": task[1]}})

    def index_of(self, job: str, task: int) -> int:
        """The place in `workers` of TensorFlow's task `task` of `job`."""
        return task + (1 if job == "worker" and self.chief_task else 0)


def parse_workers(text: str, index: int | None) -> Cluster:
    """`--workers host:port,host:port,... --worker-index N` as a Cluster, or one line naming
    the part that is wrong."""
    workers = tuple(part.strip() for part in text.split(",") if part.strip())
    if len(workers) < 2:
        raise ClusterError(
            f"--workers {text!r}: give every worker's host:port, comma-separated (at least "
            "two; the first is the chief); one machine needs no --workers"
        )
    for address in workers:
        _host_port(address, "--workers")
    repeated = sorted({a for a in workers if workers.count(a) > 1})
    if repeated:
        raise ClusterError(f"--workers: {', '.join(repeated)} given more than once")
    if index is None:
        raise ClusterError("--workers needs --worker-index N: this machine's place in the list")
    if not 0 <= index < len(workers):
        raise ClusterError(
            f"--worker-index {index}: the list has {len(workers)} workers, so it is 0 to "
            f"{len(workers) - 1}"
        )
    return Cluster(workers, index)


def cluster_from_tf_config(text: str) -> Cluster:
    """The Cluster a TF_CONFIG describes (a scheduler's): its `chief` task first if it has
    one, then its `worker` tasks."""
    try:
        spec = json.loads(text)
        jobs = spec["cluster"]
        workers = [*jobs.get("chief", []), *jobs.get("worker", [])]
        task_type, task_index = spec["task"]["type"], int(spec["task"]["index"])
    except (ValueError, KeyError, TypeError) as err:
        raise ClusterError(
            f"TF_CONFIG is not a cluster description ({err}); set it as TensorFlow documents "
            '({"cluster": {"worker": [...]}, "task": {"type": "worker", "index": N}}) or '
            "use --workers and --worker-index"
        ) from None
    if task_type not in ("chief", "worker") or set(jobs) - {"chief", "worker"}:
        raise ClusterError(
            f"TF_CONFIG: asrkit trains with `chief` and `worker` tasks only (found "
            f"{sorted({*jobs, task_type})}); parameter servers and evaluators are not used"
        )
    index = task_index + (len(jobs.get("chief", [])) if task_type == "worker" else 0)
    if len(workers) < 2 or not 0 <= index < len(workers):
        raise ClusterError(f"TF_CONFIG: task {task_type} {task_index} is not in its cluster")
    for address in workers:
        _host_port(address, "TF_CONFIG")
    return Cluster(tuple(workers), index, chief_task=bool(jobs.get("chief")))


def _host_port(address: str, where: str) -> tuple[str, int]:
    host, sep, port = address.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ClusterError(f"{where}: {address!r} is not host:port (e.g. node1:2222)")
    return host.strip("[]"), int(port)


def meet(cluster: Cluster, exp_dir: Path, settings: dict, timeout: float) -> None:
    """Returns once every worker started with the same worker list and `settings` and sees
    the same `exp_dir`; raises ClusterError (on every worker that can be told) otherwise."""
    deadline = time.monotonic() + timeout
    if cluster.chief:
        Path(exp_dir).mkdir(parents=True, exist_ok=True)
        _chair(cluster, Path(exp_dir), settings, deadline, timeout)
    else:
        _attend(cluster, Path(exp_dir), settings, deadline, timeout)


def _chair(cluster: Cluster, exp_dir: Path, settings: dict, deadline: float, timeout):
    _, port = _host_port(cluster.workers[0], "--workers")
    try:
        server = _listen(port)
    except OSError as err:
        raise ClusterError(
            f"{cluster.name(0)}: cannot listen on port {port} here ({err.strerror}): if a "
            "chief (--worker-index 0) is already running on this machine, give each process "
            "its own --worker-index; otherwise pick a free port for the chief in --workers"
        ) from None
    with server:
        server.settimeout(_POLL)
        peers: dict[int, _Peer] = {}
        try:
            problem = None
            while len(peers) < len(cluster.workers) - 1 and problem is None:
                if time.monotonic() > deadline:
                    missing = [cluster.name(i) for i in range(1, len(cluster.workers))
                               if i not in peers]  # fmt: skip
                    problem = (
                        f"{', '.join(missing)} did not join within {timeout:.0f} s: start "
                        "each missing worker with the same command and its --worker-index, "
                        f"and check that {cluster.workers[0]} is reachable from its machine "
                        "(or raise --start-timeout)"
                    )
                    break
                try:
                    conn, _ = server.accept()
                except TimeoutError:
                    continue
                peer = _Peer(conn, deadline)
                hello = peer.receive()
                if hello is None:
                    peer.close()
                    continue
                index = int(hello.get("index", -1))
                if index in peers or index == 0:
                    problem = (
                        f"two workers were started with --worker-index {index}: give each "
                        "machine its own place in the list"
                    )
                    peer.send({"error": problem})  # the second one is told as well
                    peer.receive()
                    peer.close()
                    break
                problem = _disagreement(cluster, hello, settings)
                peers[index] = peer
            if problem is None:
                problem = _shared_directory_problem(cluster, exp_dir, peers)
            for peer in peers.values():
                peer.send({"error": problem} if problem else {"ok": True})
            for peer in peers.values():  # each worker closes first: its port keeps no wait
                peer.receive()
        finally:
            for peer in peers.values():
                peer.close()
    if problem:
        raise ClusterError(problem)


def _disagreement(cluster: Cluster, hello: dict, settings: dict) -> str | None:
    index = int(hello.get("index", -1))
    workers = tuple(hello.get("workers", ()))
    if workers != cluster.workers:
        return (
            f"worker {index} was started with {len(workers)} workers ({','.join(workers)}), "
            f"the chief with {len(cluster.workers)} ({','.join(cluster.workers)}): give every "
            "worker the same --workers list"
        )
    theirs = hello.get("settings", {})
    for key in sorted(set(settings) | set(theirs)):
        if settings.get(key) != theirs.get(key):
            return (
                f"worker {index} was started with other settings than the chief: {key} is "
                f"{theirs.get(key)!r} there, {settings.get(key)!r} on the chief; start every "
                "worker with the same config and --set options"
            )
    return None


def _shared_directory_problem(cluster: Cluster, exp_dir: Path, peers: dict) -> str | None:
    token = secrets.token_hex(8)
    marker = exp_dir / MARKER
    marker.write_text(token)
    try:
        for peer in peers.values():
            peer.send({"check": MARKER, "token": token})
        blind = [i for i, peer in sorted(peers.items()) if not (peer.receive() or {}).get("sees")]
    finally:
        marker.unlink(missing_ok=True)
    if not blind:
        return None
    return (
        f"--exp-dir: {', '.join(map(cluster.name, blind))} does not see the file the chief "
        f"wrote into {exp_dir}: put the experiment directory on a file system every worker "
        "mounts at the same path, and give every worker that path"
    )


def _attend(cluster: Cluster, exp_dir: Path, settings: dict, deadline: float, timeout):
    _, own = _host_port(cluster.workers[cluster.index], "--workers")
    try:
        _listen(own).close()
    except OSError as err:
        raise ClusterError(
            f"{cluster.name(cluster.index)}: cannot listen on port {own} here "
            f"({err.strerror}): if --worker-index {cluster.index} is already running on this "
            "machine, give each process its own --worker-index; otherwise pick a free port "
            "for this worker in --workers"
        ) from None
    host, port = _host_port(cluster.workers[0], "--workers")
    hello = {"index": cluster.index, "workers": list(cluster.workers), "settings": settings}
    while True:
        try:
            conn = socket.create_connection((host, port), timeout=_POLL * 5)
            break
        except OSError:
            if time.monotonic() > deadline:
                raise ClusterError(
                    f"the chief, {cluster.name(0)}, did not answer within {timeout:.0f} s: "
                    "start it, check the address and that its port is open to this machine "
                    "(or raise --start-timeout)"
                ) from None
            time.sleep(_POLL)
    peer = _Peer(conn, deadline + 60)
    try:
        peer.send(hello)
        while True:
            message = peer.receive()
            if message is None:
                raise ClusterError(
                    f"the chief, {cluster.name(0)}, closed the connection during start-up "
                    f"(had worker {cluster.index} already joined from another process? give "
                    "each its own --worker-index): see the chief's output"
                )
            if "check" in message:
                try:
                    sees = (exp_dir / message["check"]).read_text() == message["token"]
                except OSError:
                    sees = False
                peer.send({"sees": sees})
            elif "error" in message:
                raise ClusterError(message["error"])
            else:
                return
    finally:
        peer.close()


def _listen(port: int) -> socket.socket:
    """A socket listening on `port` of every address of this machine, IPv4 and IPv6."""
    if socket.has_dualstack_ipv6():
        return socket.create_server(("", port), family=socket.AF_INET6, dualstack_ipv6=True)
    return socket.create_server(("", port))


class _Peer:
    """One JSON message per line over a socket, each read by the deadline."""

    def __init__(self, conn: socket.socket, deadline: float):
        self.conn, self.deadline = conn, deadline
        self.file = conn.makefile("rwb")

    def send(self, message: dict) -> None:
        with contextlib.suppress(OSError):
            self.file.write(json.dumps(message).encode() + b"\n")
            self.file.flush()

    def receive(self) -> dict | None:
        self.conn.settimeout(max(self.deadline - time.monotonic(), 0.1))
        try:
            line = self.file.readline()
            return json.loads(line) if line else None
        except (OSError, ValueError):
            return None

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.file.close()
            self.conn.close()


def settings_of(config) -> dict:
    """The config as flat `section.key` -> value, what the workers compare."""
    flat = {}

    def walk(prefix, value):
        if isinstance(value, dict):
            for key, inner in value.items():
                walk(f"{prefix}.{key}" if prefix else key, inner)
        else:
            flat[prefix] = value if isinstance(value, (str, int, float, bool, type(None))) \
                else str(value)  # fmt: skip

    walk("", dataclasses.asdict(config))
    return flat


_TASK = re.compile(r"/job:(chief|worker)/replica:\d+/task:(\d+)")


def lost_worker(cluster: Cluster, error: Exception, checkpoint: str | None) -> WorkerLost:
    """TensorFlow's error from a collective whose peer went away, as one line naming that
    worker (the first other task its message names) and what to do: resume from
    `checkpoint` (the last complete one's name), or with none yet start again."""
    text = str(error)
    named = None
    for job, task in _TASK.findall(text):
        index = cluster.index_of(job, int(task))
        if index != cluster.index and index < len(cluster.workers):
            named = cluster.name(index)
            break
    reason = next((why for clue, why in _REASONS if clue in text), type(error).__name__)
    if checkpoint is None:
        what = ("no checkpoint was written yet: start every worker again with the same "
                "command to train from the start")  # fmt: skip
    else:
        what = (f"the last complete checkpoint is {checkpoint}: start every worker again with "
                "the same command to resume from it")  # fmt: skip
    return WorkerLost(f"{named or 'another worker'} stopped answering ({reason}); {what}")


_REASONS = (  # what TensorFlow's message says -> in a few words
    ("stopped sending heartbeats", "no heartbeat from it"),
    ("Connection reset by peer", "its connection was reset"),
    ("Socket closed", "its connection closed"),
    ("failed to connect", "cannot connect to it"),
    ("Deadline Exceeded", "a collective timed out"),
)


def cluster_of(config) -> Cluster | None:
    """The cluster a multiworker run's TF_CONFIG describes (None: one process)."""
    text = os.environ.get("TF_CONFIG")
    if config.train.strategy != "multiworker" or not text:
        return None  # without TF_CONFIG, TensorFlow runs the strategy as one worker
    return cluster_from_tf_config(text)


@contextlib.contextmanager
def naming_a_lost_worker(cluster: Cluster | None, exp_dir: Path):
    """TensorFlow's error when a collective's peer went away, as `WorkerLost` naming it and
    the checkpoint a restart resumes from."""
    import tensorflow as tf

    from asrkit.checkpoints import list_checkpoints

    try:
        yield
    except (tf.errors.UnavailableError, tf.errors.AbortedError,
            tf.errors.DeadlineExceededError, tf.errors.CancelledError) as err:  # fmt: skip
        if cluster is None:
            raise
        found = list_checkpoints(exp_dir / "checkpoints")
        raise lost_worker(cluster, err, found[-1].name if found else None) from None


def any_worker(strategy):
    """flag -> whether any worker's flag is set: one small all-reduce over the workers."""
    import tensorflow as tf

    def agree(flag: bool) -> bool:
        value = strategy.run(lambda: tf.constant(1.0 if flag else 0.0))
        return bool(strategy.reduce(tf.distribute.ReduceOp.SUM, value, axis=None) > 0)

    return agree


def worker_role(strategy) -> tuple[bool, int]:
    """(is this process the chief, its task index) — single-process strategies: (True, 0)."""
    resolver = getattr(strategy, "cluster_resolver", None)
    if resolver is None or not resolver.task_type:
        return True, 0
    jobs = resolver.cluster_spec().jobs
    task_type, task_id = resolver.task_type, int(resolver.task_id or 0)
    if "chief" in jobs:
        return task_type == "chief", task_id
    return task_type == "worker" and task_id == 0, task_id
