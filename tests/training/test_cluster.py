"""The workers' start-up meeting on loopback (threads of this process), the worker list and
TF_CONFIG parsing, and naming a lost worker from TensorFlow's messages."""

import json
import socket
import threading
import time

import pytest

from asrkit.training.cluster import (
    MARKER,
    Cluster,
    ClusterError,
    WorkerLost,
    cluster_from_tf_config,
    lost_worker,
    meet,
    parse_workers,
)
from tests.training.test_multi_worker import free_ports

SETTINGS = {"train.learning_rate": 0.003, "data.train_shards": "shards/train"}


def _meet_all(clusters, dirs, settings, timeout=20.0, stagger=0.0):
    """Runs `meet` for each cluster in its own thread (the i-th `stagger` x i seconds
    late); each one's exception or None."""
    outcome = [None] * len(clusters)

    def one(i):
        time.sleep(stagger * i)
        try:
            meet(clusters[i], dirs[i], settings[i], timeout)
        except Exception as err:
            outcome[i] = err

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(clusters))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout + 30)
        assert not thread.is_alive()
    return outcome


def _workers(n):
    return tuple(f"127.0.0.1:{p}" for p in free_ports(n))


def test_workers_that_agree_meet_and_leave_nothing_behind(tmp_path):
    workers = _workers(3)
    clusters = [Cluster(workers, i) for i in range(3)]
    assert _meet_all(clusters, [tmp_path] * 3, [SETTINGS] * 3) == [None, None, None]
    assert list(tmp_path.iterdir()) == []
    # The chief's port is free again for TensorFlow.
    socket.create_server(("", int(workers[0].rsplit(":")[1]))).close()


def test_a_worker_that_never_comes_is_named_by_the_chief(tmp_path):
    workers = _workers(3)
    clusters = [Cluster(workers, 0), Cluster(workers, 2)]  # worker 1 never starts
    chief, other = _meet_all(clusters, [tmp_path] * 2, [SETTINGS] * 2, timeout=1.5)
    assert isinstance(chief, ClusterError)
    assert f"worker 1 ({workers[1]}) did not join within 2 s" in str(chief)
    assert str(other) == str(chief)  # the waiting worker is told the same
    assert not (tmp_path / MARKER).exists()


def test_a_worker_without_its_chief_names_the_chief(tmp_path):
    workers = _workers(2)
    (err,) = _meet_all([Cluster(workers, 1)], [tmp_path], [SETTINGS], timeout=1.0)
    assert isinstance(err, ClusterError)
    assert f"the chief, worker 0 ({workers[0]}), did not answer within 1 s" in str(err)


def test_another_worker_list_is_refused_on_both_sides(tmp_path):
    workers = _workers(3)
    clusters = [Cluster(workers[:2], 0), Cluster(workers, 1)]
    errors = _meet_all(clusters, [tmp_path] * 2, [SETTINGS] * 2, timeout=5)
    assert all(isinstance(e, ClusterError) for e in errors)
    assert "worker 1 was started with 3 workers" in str(errors[0])
    assert "the chief with 2" in str(errors[0]) and str(errors[1]) == str(errors[0])


def test_other_settings_are_refused_naming_the_key(tmp_path):
    workers = _workers(2)
    theirs = dict(SETTINGS, **{"train.learning_rate": 0.1})
    errors = _meet_all([Cluster(workers, 0), Cluster(workers, 1)], [tmp_path] * 2,
                       [SETTINGS, theirs], timeout=5)  # fmt: skip
    assert all(isinstance(e, ClusterError) for e in errors)
    assert "train.learning_rate is 0.1 there, 0.003 on the chief" in str(errors[0])


def test_an_experiment_directory_that_is_not_shared_is_refused(tmp_path):
    workers = _workers(3)
    shared, elsewhere = tmp_path / "shared", tmp_path / "local"
    elsewhere.mkdir()
    clusters = [Cluster(workers, i) for i in range(3)]
    errors = _meet_all(clusters, [shared, shared, elsewhere], [SETTINGS] * 3, timeout=5)
    assert all(isinstance(e, ClusterError) for e in errors)
    assert f"worker 2 ({workers[2]}) does not see the file the chief wrote" in str(errors[0])
    assert "worker 1" not in str(errors[0])
    assert not (shared / MARKER).exists()


def test_two_workers_with_one_index_are_refused(tmp_path):
    workers = _workers(3)
    clusters = [Cluster(workers, 0), Cluster(workers, 1), Cluster(workers, 1)]
    # staggered: on one machine the two would also race for worker 1's port
    errors = _meet_all(clusters, [tmp_path] * 3, [SETTINGS] * 3, timeout=10, stagger=0.5)
    # the chief and both duplicates each name the index given twice
    assert all("two workers were started with --worker-index 1" in str(e) for e in errors)


def test_a_busy_port_is_named(tmp_path):
    workers = _workers(2)
    with socket.create_server(("", int(workers[1].rsplit(":")[1]))):
        (err,) = _meet_all([Cluster(workers, 1)], [tmp_path], [SETTINGS], timeout=1)
    assert f"worker 1 ({workers[1]}): cannot listen on port" in str(err)
    # on one machine, the port's holder may be the same --worker-index started twice
    assert (
        "if --worker-index 1 is already running on this machine, give each process its "
        "own --worker-index" in str(err)
    )


@pytest.mark.parametrize(
    ("text", "index", "message"),
    [
        ("a:1", 0, "at least two"),
        ("a:1,b", 0, "'b' is not host:port"),
        ("a:1,b:70000", 0, "'b:70000' is not host:port"),
        ("a:1,a:1", 0, "a:1 given more than once"),
        ("a:1,b:2", None, "needs --worker-index"),
        ("a:1,b:2", 2, "0 to 1"),
    ],
)
def test_a_bad_worker_list_is_refused_in_one_line(text, index, message):
    with pytest.raises(ClusterError, match=message):
        parse_workers(text, index)


def test_the_worker_list_becomes_tensorflow_config():
    cluster = parse_workers("node1:2222, node2:2222,[::1]:3333", 2)
    assert cluster.workers == ("node1:2222", "node2:2222", "[::1]:3333")
    spec = json.loads(cluster.tf_config())
    assert spec == {"cluster": {"worker": list(cluster.workers)},
                    "task": {"type": "worker", "index": 2}}  # fmt: skip
    assert cluster_from_tf_config(cluster.tf_config()) == cluster


def test_a_scheduler_config_with_a_chief_task_puts_the_chief_first():
    spec = {"cluster": {"chief": ["c:1"], "worker": ["w:1", "w:2"]},
            "task": {"type": "worker", "index": 1}}  # fmt: skip
    cluster = cluster_from_tf_config(json.dumps(spec))
    assert cluster == Cluster(("c:1", "w:1", "w:2"), 2, chief_task=True)
    assert json.loads(cluster.tf_config()) == spec  # written back as the scheduler wrote it
    spec["cluster"]["ps"] = ["p:1"]
    with pytest.raises(ClusterError, match="parameter servers"):
        cluster_from_tf_config(json.dumps(spec))


def test_a_lost_worker_is_named_from_tensorflows_message():
    cluster = Cluster(("h0:1", "h1:1", "h2:1"), 0)
    heartbeat = (
        "{{function_node __wrapped__CollectiveReduceV2_device_/job:worker/replica:0/task:0/"
        "device:CPU:0}} Collective ops is aborted by: Error reported from /job:worker/task:2: "
        "The following tasks are unhealthy (stopped sending heartbeats):\n"
        "/job:worker/replica:0/task:2\nThe tasks have crashed."
    )
    err = lost_worker(cluster, RuntimeError(heartbeat), "ckpt-4")
    assert isinstance(err, WorkerLost) and err.exit_code == 3
    assert str(err).startswith("worker 2 (h2:1) stopped answering (no heartbeat from it)")
    assert "ckpt-4: start every worker again with the same command to resume" in str(err)
    fresh = str(lost_worker(cluster, RuntimeError(heartbeat), None))
    assert (
        "no checkpoint was written yet: start every worker again with the same command "
        "to train from the start"
        in fresh
        and "resume" not in fresh
    )
    reset = ("Collective ops is aborted by: recvmsg:Connection reset by peer\nAdditional GRPC "
             "error information from remote target /job:worker/replica:0/task:0")  # fmt: skip
    err = lost_worker(Cluster(cluster.workers, 1), RuntimeError(reset), "x")
    assert str(err).startswith("worker 0 (h0:1) stopped answering (its connection was reset)")
    # A scheduler's chief task: the chief reports, TensorFlow's worker 1 is the list's 2.
    scheduled = Cluster(cluster.workers, 0, chief_task=True)
    from_chief = heartbeat.replace("job:worker/replica:0/task:0", "job:chief/replica:0/task:0")
    err = lost_worker(scheduled, RuntimeError(from_chief.replace("task:2", "task:1")), "x")
    assert str(err).startswith("worker 2 (h2:1) stopped answering")


def test_workers_meet_over_ipv6_too(tmp_path):
    if not socket.has_ipv6:
        pytest.skip("no IPv6 on this machine")
    workers = tuple(f"[::1]:{p}" for p in free_ports(2))
    clusters = [Cluster(workers, i) for i in range(2)]
    assert _meet_all(clusters, [tmp_path] * 2, [SETTINGS] * 2) == [None, None]
