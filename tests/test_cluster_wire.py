"""The worker's side of RQ's wire, and the reconciler's cleanup and figures, on a Redis
Cluster of three masters and three replicas started by the test: jobs of queues on every
shard taken, finished and found alive, RQ's registries cleaned, Redis' figures summed.

Seen failing, all seven, against the wire before it knew a cluster: its take named the
worker's key beside the queues' (refused: "all keys must map to the same key slot"), as did
the cleanup's one call over every queue; the figures read the servers' memory in a pipeline,
which a cluster's client refuses."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import cast

import pytest
from redis.cluster import RedisCluster
from redis.exceptions import ConnectionError

from duejobs.delivery import Deliverer, registries
from duejobs.rq_wire.keys import WORKERS_KEY, queue_keys, rq_name
from duejobs.rq_wire.watch import ANYWHERE, Watch
from duejobs.rq_wire.worker_side import Finished, RqWire, Taken
from tests.support import wait_for
from tests.support.cluster import QUEUES, push_due


@pytest.fixture
def deliverer(cluster_client: RedisCluster) -> Iterator[Deliverer]:
    made = Deliverer(cluster_client, QUEUES[0])
    yield made
    made.close()


@pytest.fixture
def wire(cluster_client: RedisCluster) -> Iterator[RqWire]:
    made = RqWire(cluster_client, QUEUES, "w1")
    made.register()
    yield made
    made.retire()


def _pushed(deliverer: Deliverer, each: int = 2) -> list[str]:
    pushes = [push_due(q, -1, priority=p) for q in QUEUES for p in range(each)]
    deliverer.push(pushes, datetime.now(UTC))
    return sorted(p.delivery.job_id for p in pushes)


def _take_all(wire: RqWire, want: int) -> list[Taken]:
    taken: list[Taken] = []
    deadline = time.monotonic() + 10
    while len(taken) < want and time.monotonic() < deadline:
        taken += wire.take(want - len(taken), 0)
    return taken


def test_a_worker_takes_and_finishes_jobs_of_queues_on_every_shard(
    deliverer: Deliverer, wire: RqWire, cluster_client: RedisCluster
) -> None:
    pushed = _pushed(deliverer)
    taken = wire.take(len(pushed), 0)
    assert sorted(t.job_id for t in taken) == pushed
    assert {t.delivery.queue for t in taken if t.delivery} == set(QUEUES)
    wire.finish([Finished(t, "succeeded", seconds=0.01) for t in taken], "idle")
    for t in taken:
        keys = queue_keys(t.queue)
        assert cluster_client.hget(keys.job_prefix + t.job_id, "status") == b"finished"
        assert cluster_client.zscore(keys.finished, t.job_id) is not None
        assert cluster_client.zcard(keys.started) == 0
        assert cluster_client.xlen(keys.results_prefix + t.job_id) == 1
    figures = cluster_client.hgetall(wire.key)
    assert figures[b"successful_job_count"] == str(len(pushed)).encode()
    assert figures[b"state"] == b"idle"


def test_finishes_of_several_shards_go_with_the_next_take(
    deliverer: Deliverer, wire: RqWire, cluster_client: RedisCluster
) -> None:
    first = _take_all(wire, len(_pushed(deliverer, each=1)))
    done = [Finished(t, "succeeded") for t in first]
    _pushed(deliverer, each=1)
    again = wire.take(len(QUEUES), 0, finishing=done)
    assert len(again) == len(QUEUES) and done == []
    assert cluster_client.hget(wire.key, "successful_job_count") == str(len(QUEUES)).encode()
    assert cluster_client.hget(wire.key, "state") == b"busy"


@pytest.mark.parametrize("queues", [QUEUES[:1], QUEUES], ids=["one queue", "six queues"])
def test_a_blocking_take_on_a_cluster_returns_a_job_pushed_while_it_waits(
    deliverer: Deliverer, cluster_client: RedisCluster, queues: tuple[str, ...]
) -> None:
    """One queue: the take blocks on its bands; several: a watch of each band list."""
    wire = RqWire(cluster_client, queues, "w2")
    late = push_due(queues[-1], -1)
    timer = threading.Timer(0.3, lambda: deliverer.push([late], datetime.now(UTC)))
    timer.start()
    try:
        found: list[Taken] = []
        wait_for(lambda: bool(found.extend(wire.take(1, 1.0)) or found), 10, "the late job")
        assert [t.job_id for t in found] == [late.delivery.job_id]
    finally:
        timer.cancel()
        wire.retire()


def test_a_started_jobs_worker_on_a_cluster_is_alive_by_its_mark_in_its_queues_slot(
    deliverer: Deliverer, wire: RqWire
) -> None:
    _pushed(deliverer, each=1)
    taken = wire.take(len(QUEUES), 0)
    jobs = [(t.job_id, datetime.now(UTC), False, t.delivery.queue) for t in taken if t.delivery]
    assert deliverer.live(jobs) == [True] * len(QUEUES)
    wire.retire()
    assert deliverer.live(jobs) == [False] * len(QUEUES)


def test_the_cleanup_on_a_cluster_removes_expired_entries_and_dead_workers_on_every_shard(
    deliverer: Deliverer, cluster_client: RedisCluster
) -> None:
    _pushed(deliverer, each=1)  # the queues known, as once their jobs were pushed
    for queue in QUEUES:
        keys = queue_keys(rq_name(queue, True))
        cluster_client.zadd(keys.finished, {"gone-job": 1.0})
        cluster_client.sadd(keys.workers, "rq:worker:dead")
    cluster_client.sadd(WORKERS_KEY, "rq:worker:dead")
    cleaned = registries.clean(deliverer)
    assert (cleaned.expired, cleaned.dead_workers) == (len(QUEUES), len(QUEUES) + 1)
    assert cluster_client.scard(WORKERS_KEY) == 0


def test_redis_figures_on_a_cluster_sum_every_shard(deliverer: Deliverer) -> None:
    pushed = _pushed(deliverer)
    figures = registries.structures(deliverer)
    assert figures.structures["queue"].entries == len(pushed)
    assert figures.keys >= len(pushed) and figures.used_memory > 0


def test_a_blocking_take_on_a_cluster_starts_no_more_than_asked(
    deliverer: Deliverer, cluster_client: RedisCluster
) -> None:
    """A worker of two queues waits while jobs arrive on both: no more start than the slots
    it asked for, the others stay queued. Seen failing, when a blocking take popped a job
    off the queue it waited on, with the queues then called in their usual order (the first
    queue's two jobs, then the popped one: three started for two slots)."""
    wire = RqWire(cluster_client, QUEUES[:2], "w3")
    arriving = [push_due(QUEUES[0], -1), push_due(QUEUES[0], -1), push_due(QUEUES[1], -1)]

    def jobs_arrive() -> bool:
        deliverer.push(arriving, datetime.now(UTC))
        return True

    taken = wire.take(2, 1.0, may_block=jobs_arrive)
    assert len(taken) == 2
    assert len(wire.take(3, 0)) == 1
    wire.retire()


def test_a_worker_of_six_queues_on_a_cluster_wakes_for_a_job_pushed_on_any_of_them(
    deliverer: Deliverer, cluster_client: RedisCluster
) -> None:
    """One blocking take of a six-queue worker returns a job pushed onto the last queue while
    it waits (a watch blocks on every band list), and leaves the other lists as they were.
    Seen failing when the take waited on one queue's bands at a time, 0.1 s each: it returned
    nothing (the job started up to a turn of the queues later)."""
    before = set(_watches())
    wire = RqWire(cluster_client, QUEUES, "w5")
    found: list[Taken] = []
    taking = threading.Thread(target=lambda: found.extend(wire.take(1, 10.0)))
    taking.start()
    try:
        wait_for(lambda: _blocked(cluster_client) > 0, 10, "the take to block")
        late = push_due(QUEUES[-1], -1)
        deliverer.push([late], datetime.now(UTC))
        taking.join(10)
        assert [t.job_id for t in found] == [late.delivery.job_id]
    finally:
        wire.retire()
        taking.join(10)
    wait_for(lambda: not _watches() - before, 15, "the watches to end once the worker retired")


def _watches() -> set[threading.Thread]:
    return {t for t in threading.enumerate() if t.name == "duejobs-watch"}


def _blocked(client: RedisCluster) -> int:
    """Clients blocked in a command, over every master."""
    lists = client.client_list(target_nodes=RedisCluster.PRIMARIES)
    return sum("b" in entry["flags"] for entries in lists.values() for entry in entries)


def test_a_cluster_take_whose_later_call_failed_hands_out_the_jobs_its_first_call_started(
    deliverer: Deliverer, cluster_client: RedisCluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A take of two queues is two script calls on a cluster: the second one failing (its
    shard away) leaves the first one's job started for this worker, and the next take hands
    it out, once. Seen failing with each call's run ids forgotten once it answered: the job
    stayed started, and no take found it."""
    wire = RqWire(cluster_client, QUEUES[:2], "w4")
    pushes = [push_due(queue, -1) for queue in QUEUES[:2]]
    deliverer.push(pushes, datetime.now(UTC))
    script, calls = wire._script, []

    def second_fails(**kwargs: object) -> object:
        calls.append(kwargs)
        if len(calls) == 2:
            raise ConnectionError("the second shard is away")
        return script(**kwargs)

    monkeypatch.setattr(wire, "_script", second_fails)
    with pytest.raises(ConnectionError):
        wire.take(2, 0)
    handed = [t.job_id for _ in range(3) for t in wire.take(2, 0)]
    assert sorted(handed) == sorted(p.delivery.job_id for p in pushes)


class _Stub:
    """A cluster client's two calls a watch makes: list ``a`` never answers a job; list
    ``b``'s first BLMOVE raises an error of the client's own, then it answers a job."""

    def __init__(self) -> None:
        self.failed = False

    def get_connection_kwargs(self) -> dict[str, object]:
        return {"socket_timeout": 10.0}

    def execute_command(self, *command: object) -> object:
        if command[1] == "b" and not self.failed:
            self.failed = True
            raise AttributeError("'NoneType' object has no attribute 'name'")
        time.sleep(0.05)
        return None if command[1] == "a" else b"job"


def test_a_watch_whose_client_fails_of_its_own_wakes_the_take_and_goes_on_watching() -> None:
    """An error of redis-py's own (not a Redis failure) wakes the take to look through every
    queue, and the watch answers the waits after it. Seen failing with the watch catching
    Redis' failures alone: its thread ended, and the waits after it heard nothing from it."""
    watch = Watch(cast(RedisCluster, _Stub()), ["a", "b"])
    try:
        assert watch.wait(5.0) == ANYWHERE
        assert [watch.wait(2.0) for _ in range(3)] == [1, 1, 1]
    finally:
        watch.close()


def test_a_take_woken_by_a_watch_takes_first_from_the_queue_whose_list_answered(
    deliverer: Deliverer, cluster_client: RedisCluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Jobs on the first and the last queue, the watch of the last one's list answering
    first: a take of one takes the last queue's. Seen failing with the calls in the take's
    usual order (the first queue's job taken)."""
    wire = RqWire(cluster_client, QUEUES, "w6")
    last = push_due(QUEUES[-1], -1)
    answered = wire.queues.index(rq_name(QUEUES[-1], True))  # its default band's list
    assert wire._watch is not None
    monkeypatch.setattr(wire._watch, "wait", lambda seconds: answered)

    def jobs_arrive() -> bool:
        deliverer.push([push_due(QUEUES[0], -1), last], datetime.now(UTC))
        return True

    try:
        assert [t.job_id for t in wire.take(1, 1.0, may_block=jobs_arrive)] == [
            last.delivery.job_id
        ]
    finally:
        wire.retire()


class _Timed:
    """A cluster client of a short socket timeout whose lists never answer, recording the
    blocks asked for."""

    def __init__(self) -> None:
        self.blocks: list[float] = []

    def get_connection_kwargs(self) -> dict[str, object]:
        return {"socket_timeout": 0.4}

    def execute_command(self, *command: object) -> object:
        block = float(cast(float, command[-1]))
        self.blocks.append(block)
        time.sleep(block)
        return None


def test_a_watch_blocks_at_most_half_its_clients_socket_timeout() -> None:
    """A block as long as the socket timeout would fail as a timeout at every idle wait.
    Seen failing with the block capped at 1 s whatever the client's timeout."""
    client = _Timed()
    watch = Watch(cast(RedisCluster, client), ["a"])
    try:
        assert watch.wait(1.0) is None
        assert client.blocks and max(client.blocks) <= 0.2
    finally:
        watch.close()
