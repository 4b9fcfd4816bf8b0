"""A worker never exits because of Redis, at any slot count: a Redis killed and started again
(empty) while jobs run, and one that turns into a replica refusing writes (a failover not
followed yet), are waited out, and the worker runs what comes once Redis answers.

Seen failing against the worker that subclassed RQ's: with 4 slots it exited (status 1,
"found an unhandled exception") on the killed Redis, and with either slot count on
``READONLY``.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import redis
from redis.exceptions import (
    ClusterDownError,
    ClusterError,
    RedisClusterException,
    RedisClusterUnreachableError,
    SlotNotCoveredError,
)

from duejobs import App
from duejobs.redis_urls import is_outage
from duejobs.scheduler.loop import Scheduler
from duejobs.worker.redis_waits import RedisWaits
from tests.support import wait_for
from tests.support.apps import register
from tests.support.network import free_ports
from tests.support.processes import ROOT, Proc
from tests.support.valkey import Node, server_binary

WORKER = ["worker", "--app", "tests.support.apps:app", "--log-level", "warning"]


@pytest.fixture
def node(tmp_path: Path) -> Iterator[Node]:
    """A Valkey server of the test's own, to kill and to demote."""
    binary = server_binary()
    (port,) = free_ports(1)
    started = Node(binary, port, tmp_path)
    started.start()
    try:
        yield started
    finally:
        started.kill()


@pytest.fixture
def on_node(database_url: str, node: Node) -> Iterator[App]:
    app = register(App(database_url, node.url))
    try:
        yield app
    finally:
        app.close()


def _succeeded(app: App, ids: list[object]) -> bool:
    return all(app.get(i).status.value == "succeeded" for i in ids)  # type: ignore[union-attr]


def _push(app: App, kind: str, n: int, payload: dict[str, object]) -> list[object]:
    ids: list[object] = [app.schedule(kind, payload, delay=0).id for _ in range(n)]
    scheduler = Scheduler(app)
    try:
        scheduler.run_once()
    finally:
        scheduler.close()
    return ids


@pytest.mark.parametrize("slots", [1, 4])
def test_a_worker_outlives_redis_killed_while_its_jobs_run(
    slots: int, node: Node, on_node: App, spawn: Callable[..., Proc]
) -> None:
    first = _push(on_node, "slow", slots, {"seconds": 1})
    env = {"DUEJOBS_REDIS_URL": node.url}
    worker = spawn(*WORKER, "--concurrency", str(slots), extra_env=env)
    running = lambda: sum(on_node.get(i).status.value == "running" for i in first)  # type: ignore[union-attr]  # noqa: E731
    wait_for(lambda: running() == slots, 30, "every slot to run a job")
    node.kill()
    # Their outcomes are recorded; their finishes in RQ meet the outage.
    wait_for(lambda: _succeeded(on_node, first), 30, "the jobs that ran through the outage")
    node.start()  # empty: what Redis held is gone; the database holds every schedule
    after = _push(on_node, "record", 4, {})
    wait_for(lambda: _succeeded(on_node, after), 30, "the jobs pushed after the outage")
    with node.client() as client:  # registered again in RQ's worker sets, as at its start
        wait_for(lambda: client.scard("rq:workers") == 1, 30, "the worker registered again")
    assert worker.popen.poll() is None, worker.output()
    assert "answers again" in worker.output(), worker.output()
    assert worker.stop() == 0, worker.output()


@pytest.mark.parametrize("slots", [1, 4])
def test_a_worker_outlives_a_redis_that_turned_replica(
    slots: int, node: Node, on_node: App, spawn: Callable[..., Proc]
) -> None:
    env = {"DUEJOBS_REDIS_URL": node.url}
    worker = spawn(*WORKER, "--concurrency", str(slots), extra_env=env)
    with node.client() as client:
        wait_for(lambda: client.scard("rq:workers") == 1, 30, "the worker to start")
        client.replicaof("127.0.0.1", str(free_ports(1)[0]))  # a master that is not there
        # Its blocking take ends UNBLOCKED, its next ones READONLY (redis-py drops that
        # prefix): one outage, one line, whichever it met first.
        said = ("instance state changed", "read only replica")
        wait_for(lambda: any(s in worker.output() for s in said), 30, "the worker to meet it")
        client.replicaof("NO", "ONE")
    ids = _push(on_node, "record", 4, {})
    wait_for(lambda: _succeeded(on_node, ids), 30, "the jobs pushed once it is a master again")
    assert worker.popen.poll() is None, worker.output()
    assert "Traceback" not in worker.output(), worker.output()  # an outage, not an error
    assert worker.stop() == 0, worker.output()


@pytest.mark.parametrize(
    "reply",
    [
        "LOADING Redis is loading the dataset in memory",
        "MASTERDOWN Link with MASTER is down and replica-serve-stale-data is set to 'no'.",
        "NOREPLICAS Not enough good replicas to write.",
        "MISCONF Redis is configured to save RDB snapshots, but it's currently unable to persist",
        "BUSY Redis is busy running a script.",
        "UNBLOCKED force unblock from blocking operation, instance state changed (master -> "
        "replica?)",
    ],
)
def test_replies_of_a_server_passing_through_trouble_are_outages_to_wait_out(reply: str) -> None:
    """What a master short of replicas, one that cannot save, or one busy with a script
    answers mends by waiting: the worker waits, its heartbeat thread included. Seen failing
    with NOREPLICAS, MISCONF and BUSY raised (the heartbeat thread ended on them), and with
    UNBLOCKED — a worker waiting in BLPOP on a master turned replica — logged as an error with
    its traceback and a fixed pause."""
    assert is_outage(redis.ResponseError(reply))
    assert not is_outage(redis.ResponseError("WRONGTYPE Operation against a key"))


def test_a_cluster_down_or_its_slots_moving_past_the_retries_is_an_outage_to_wait_out() -> None:
    """A cluster's client reports a master down before its replica is promoted, and slots
    still moving once its own redirections are spent, as errors of its own (its parser takes
    the ``CLUSTERDOWN`` word off the reply). Seen failing: both were raised to the worker."""
    assert is_outage(ClusterDownError("The cluster is down"))
    assert is_outage(ClusterError("TTL exhausted."))


def test_a_cluster_no_node_of_which_answers_or_a_slot_unserved_is_an_outage_to_wait_out() -> None:
    """redis-py's cluster client raises these outside the ``RedisError`` family: a cluster
    restarted whole, or away when the client is made, and a slot between its master's loss
    and its replica's promotion. A request the client itself refuses (keys of several slots)
    is a defect, raised. Seen failing: the worker's waits let them through, and it exited."""
    assert is_outage(RedisClusterUnreachableError("Redis Cluster cannot be connected"))
    assert is_outage(SlotNotCoveredError('Slot "1" is not covered by the cluster.'))
    assert is_outage(RedisClusterException("All slots are not covered after query all nodes"))
    assert not is_outage(RedisClusterException("Keys in request don't hash to the same slot"))
    calls: list[int] = []

    def unreachable_once() -> str:
        calls.append(1)
        if len(calls) == 1:
            raise RedisClusterUnreachableError("Redis Cluster cannot be connected")
        return "answered"

    assert RedisWaits("a cluster").call("a take", unreachable_once) == "answered"


@pytest.mark.parametrize(
    "command",
    [
        ("worker", "--app", "tests.support.apps:app"),
        ("scheduler",),
        ("reconcile", "--every", "1"),
    ],
)
def test_a_redis_that_refuses_the_password_ends_a_service_at_its_start_naming_it(
    env: dict[str, str], redis_url: str, redis_client: redis.Redis, command: tuple[str, ...]
) -> None:
    """A wrong password (an ACL user here): exit 2 at once, one line naming Redis and what to
    check — no retry mends it. Seen failing with the scheduler and the reconciler waiting it
    out as an outage for good (redis-py's AuthenticationError is a ConnectionError). (Three
    service processes started: about 5 s each.)"""
    user = "duejobs-refused"
    redis_client.acl_setuser(
        user, enabled=True, passwords=["+right"], keys=["*"], commands=["+@all"]
    )
    try:
        wrong = redis_url.replace("redis://", f"redis://{user}:wrong@", 1)
        done = subprocess.run(
            [sys.executable, "-m", "duejobs", *command],
            env={**env, "DUEJOBS_REDIS_URL": wrong, "PYTHONPATH": str(ROOT)},
            capture_output=True,
            text=True,
            timeout=60,
        )
    finally:
        redis_client.acl_deluser(user)
    assert done.returncode == 2, done.stderr
    assert "refuses duejobs" in done.stderr and "DUEJOBS_REDIS_URL" in done.stderr, done.stderr
    assert "wrong" not in done.stderr and "Traceback" not in done.stderr, done.stderr
