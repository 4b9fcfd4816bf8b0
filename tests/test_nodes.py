"""Delivery across several Redis/Valkey nodes (``DUEJOBS_REDIS_NODES``): three Valkey servers
on loopback, queues mapped to them, every job followed to its queue's node by the scheduler,
the workers, the reconciler and the figures; one node killed mid-way and restarted empty.

Seen failing against code broken on purpose: every push on the default node (``_node``
answering the default whatever the queue) →
``test_each_queue_is_pushed_promoted_and_counted_on_its_own_node``; a push that stops at the
first node that fails (``_each`` raising at once) →
``test_a_node_killed_midway_loses_nothing_and_holds_up_no_other_node`` (queue c waits for b);
the deliverer's clients without their timeouts (redis-py waits on a paused server) →
``test_a_node_that_hangs_fails_after_its_timeout_and_holds_up_no_other``; the count of waiting
jobs, or the check of pushed ones, raising at the first node down →
``test_the_figures_go_on_while_a_node_is_down``.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import redis
from sqlalchemy import text

from duejobs import App, redis_urls
from duejobs.config import parse_redis_nodes
from duejobs.delivery.nodes import NODE_ERRORS
from duejobs.errors import ConfigurationError
from duejobs.scheduler.loop import Scheduler, SchedulerConfig
from duejobs.services import stats
from duejobs.services.reconciler import Reconciler
from duejobs.worker import Runtime, Worker, WorkerConfig, redis_waits
from tests.support import wait_for
from tests.support.apps import register
from tests.support.network import free_ports
from tests.support.processes import Proc
from tests.support.valkey import Node, server_binary

# Starts, pauses, kills or restarts servers of its own on free ports: run on its own
# (`pytest -m serial`), never beside another test process.
pytestmark = pytest.mark.serial

QUEUES = ("a", "b", "c")


@pytest.fixture
def nodes(tmp_path: Path) -> Iterator[list[Node]]:
    binary = server_binary()
    started = [Node(binary, port, tmp_path) for port in free_ports(3)]
    try:
        for node in started:
            node.start()
        yield started
    finally:
        for node in started:
            node.kill()


@pytest.fixture
def spread(app: App, database_url: str, nodes: list[Node]) -> Iterator[App]:
    """The test App with queue a (and the default queue) on the first node, b on the
    second, c on the third."""
    spread_app = register(
        App(database_url, nodes[0].url, redis_nodes={"b": nodes[1].url, "c": nodes[2].url})
    )
    yield spread_app
    spread_app.close()


def _drain(app: App, queue: str) -> None:
    runtime = Runtime(app, WorkerConfig(heartbeat=timedelta(milliseconds=200)))
    try:
        Worker(runtime, [queue]).work(burst=True)
    finally:
        runtime.close()


def _succeeded(app: App, queue: str | None = None, due_after: datetime | None = None) -> int:
    sql = (
        "SELECT count(*) FROM scheduled_jobs WHERE status = 'succeeded' "
        "AND (CAST(:queue AS text) IS NULL OR queue = :queue) "
        "AND (CAST(:after AS timestamptz) IS NULL OR due_at > :after)"
    )
    with app.engine.connect() as conn:
        return int(conn.execute(text(sql), {"queue": queue, "after": due_after}).scalar_one())


def test_each_queue_is_pushed_promoted_and_counted_on_its_own_node(
    spread: App, nodes: list[Node]
) -> None:
    for queue in QUEUES:
        for i in range(4):
            spread.schedule("record", {"i": i}, delay=0, queue=queue, tenant=f"t-{queue}")
        spread.schedule("record", {"i": 9}, delay=timedelta(seconds=1), queue=queue)
    scheduler = Scheduler(spread)
    scheduler.run_once()
    for node, queue in zip(nodes, QUEUES, strict=True):
        with node.client() as client:
            assert client.llen(f"rq:queue:{queue}") == 4
            assert client.zcard(f"rq:scheduled:{queue}") == 1
            others = [q for q in QUEUES if q != queue]
            assert all(client.llen(f"rq:queue:{q}") == 0 for q in others)
    figures = stats.collect(spread)
    assert (figures.queued, figures.deferred) == (12, 3)
    time.sleep(1.1)  # the deferred ones fall due (the promotion reads the database clock)
    assert scheduler.run_once().promoted == 3
    for queue in QUEUES:
        _drain(spread, queue)
    assert _succeeded(spread) == 15
    figures = stats.collect(spread)
    assert figures.schedules_without_job == 0 and figures.jobs_without_schedule == 0


def test_a_node_that_hangs_fails_after_its_timeout_and_holds_up_no_other(
    app: App, database_url: str, nodes: list[Node], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A paused node (as one that is partitioned away) is given up after its clients'
    timeout and one retry (or the node wait, if shorter), well before it answers again; the
    others' jobs are pushed."""
    monkeypatch.setattr(redis_urls, "REDIS_TIMEOUT", 0.3)
    spread = register(
        App(database_url, nodes[0].url, redis_nodes={"b": nodes[1].url, "c": nodes[2].url})
    )
    try:
        on_a = spread.schedule("record", {}, delay=0, queue="a")
        on_c = spread.schedule("record", {}, delay=0, queue="c")
        with nodes[2].client() as client:
            client.execute_command("CLIENT", "PAUSE", 5_000, "ALL")
        started = time.monotonic()
        passed = Scheduler(spread).run_once()
        assert time.monotonic() - started < 4.0, "the pass waited for the paused node"
        assert passed.queued == 1
        with nodes[0].client() as client:
            assert client.lrange("rq:queue:a", 0, -1) == [spread.get(on_a.id).queue_job_id.encode()]  # type: ignore[union-attr]
        wait_for(nodes[2].answers, 10, "node c to answer again")
        reconciler = Reconciler(spread)  # its job, pushed again once a probe finds c back
        wait_for(lambda: reconciler.run_once().repushed == 1, 10, "c's job to be pushed again")
        with nodes[2].client() as client:
            assert client.llen("rq:queue:c") == 1
        assert spread.get(on_c.id) is not None
    finally:
        spread.close()


def test_a_node_that_hangs_costs_the_other_queues_passes_no_wait(
    app: App, database_url: str, nodes: list[Node], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Node c hangs (paused, as one partitioned away) while its clients would wait 2 s and
    retry once: the pass that meets it gives it up within the node wait (1 s), and the
    passes after it push queue a's jobs without calling c at all. Seen failing before each
    node had its own wait and a down node was skipped: 8 s for the first pass, 4 s for each
    later one (every promotion waited on c)."""
    monkeypatch.setattr(redis_urls, "REDIS_TIMEOUT", 2.0)
    spread = register(
        App(database_url, nodes[0].url, redis_nodes={"b": nodes[1].url, "c": nodes[2].url})
    )
    try:
        spread.schedule("record", {}, delay=0, queue="c")
        with nodes[2].client() as client:
            client.execute_command("CLIENT", "PAUSE", 30_000, "ALL")
        scheduler = Scheduler(spread)
        started = time.monotonic()
        scheduler.run_once()
        first = time.monotonic() - started
        assert first < 3.0, f"the pass that met the paused node took {first:.1f} s"
        started = time.monotonic()
        for i in range(5):
            spread.schedule("record", {"i": i}, delay=0, queue="a")
            assert scheduler.run_once().queued == 1
        later = time.monotonic() - started
        assert later < 1.5, f"five passes took {later:.1f} s: they waited on the paused node"
        with nodes[0].client() as client:
            assert client.llen("rq:queue:a") == 5
    finally:
        spread.close()


def test_a_batch_whose_rows_all_wait_on_a_down_node_holds_up_no_other_queue(
    spread: App, nodes: list[Node]
) -> None:
    """Node b is down and the oldest due rows are all b's: the batches that hold only b's
    rows leave them to the reconciler and the same pass goes on to a's and c's, instead of
    failing (and backing off) on b's rows at every pass. Once b is back, the reconciler
    pushes its rows and every job runs once. Seen failing with a push that raised when every
    node *it* needed was down: each pass failed on b's rows and a's and c's never moved."""
    for i in range(4):
        spread.schedule("record", {"i": i}, delay=0, queue="b")
    for queue in ("a", "c"):
        spread.schedule("record", {}, delay=0, queue=queue)
    nodes[1].kill()
    passed = Scheduler(spread, SchedulerConfig(batch_size=2, concurrency=1)).run_once()
    assert passed.queued == 2
    with nodes[0].client() as a, nodes[2].client() as c:
        assert a.llen("rq:queue:a") == 1 and c.llen("rq:queue:c") == 1
    nodes[1].start()
    reconciler = Reconciler(spread)
    wait_for(lambda: reconciler.run_once().repushed == 4, 10, "b's rows to be pushed again")
    for queue in QUEUES:
        _drain(spread, queue)
    assert _succeeded(spread) == 6


def test_a_node_that_refuses_writes_holds_up_no_other_queue(spread: App, nodes: list[Node]) -> None:
    """Node c answers but refuses every write (out of memory, no eviction), and the oldest
    due rows are all c's: the batch that holds only them is logged and counted and the pass
    goes on to queue a's row, instead of failing at every pass. Seen failing when a refusal
    by the only node a batch needed failed the pass whatever the other nodes could do."""
    for _ in range(2):
        spread.schedule("record", {}, delay=0, queue="c")
    spread.schedule("record", {}, delay=0, queue="a")
    with nodes[2].client() as client:
        client.config_set("maxmemory-policy", "noeviction")
        client.config_set("maxmemory", "1")
    passed = Scheduler(spread, SchedulerConfig(batch_size=2, concurrency=1)).run_once()
    assert passed.queued == 1
    with nodes[0].client() as a:
        assert a.llen("rq:queue:a") == 1


def test_a_server_named_twice_is_one_node(database_url: str, nodes: list[Node], app: App) -> None:
    """The default node spelt differently in the node table: one node, counted once."""
    short = nodes[0].url.removesuffix("/0")
    twice = register(App(database_url, nodes[0].url, redis_nodes={"b": short}))
    try:
        twice.schedule("record", {}, delay=0, queue="b")
        Scheduler(twice).run_once()
        assert stats.collect(twice).queued == 1
    finally:
        twice.close()


def test_the_figures_go_on_while_a_node_is_down(spread: App, nodes: list[Node]) -> None:
    """``duejobs stats`` (the dashboard, the reconciler's gauges) during a node's outage:
    the other nodes are counted, and the jobs on the one that is down, which no worker can
    take, are schedules without a job."""
    for queue in QUEUES:
        spread.schedule("record", {}, delay=0, queue=queue)
    Scheduler(spread).run_once()
    nodes[2].kill()
    figures = stats.collect(spread)
    assert figures.queued == 2  # a's and b's
    assert figures.schedules_without_job == 1  # c's


def test_the_scan_of_waiting_jobs_goes_on_past_a_node_down_and_fails_when_all_are(
    spread: App, nodes: list[Node]
) -> None:
    """The orphan scan (the reconciler, the figures) reads the nodes that answer; with every
    node down it raises rather than report no waiting job. Seen failing with that raise left
    out: the scan came back empty."""
    for queue in QUEUES:
        spread.schedule("record", {}, delay=0, queue=queue)
    Scheduler(spread).run_once()
    deliverer = spread.core.deliverer()
    nodes[2].kill()
    assert len([job for chunk in deliverer.waiting_job_ids() for job in chunk]) == 2
    for node in nodes[:2]:
        node.kill()
    with pytest.raises(redis.RedisError):
        list(deliverer.waiting_job_ids())


def test_a_worker_serves_the_queues_of_one_node_only(spread: App) -> None:
    runtime = Runtime(spread, WorkerConfig())
    try:
        with pytest.raises(ConfigurationError, match="one Redis node") as refused:
            Worker(runtime, ["a", "b"])
        assert "b on redis://127.0.0.1" in str(refused.value)
    finally:
        runtime.close()


def test_cancel_removes_the_waiting_job_from_its_queues_node(
    spread: App, nodes: list[Node]
) -> None:
    s = spread.schedule("record", {}, delay=0, queue="c")
    Scheduler(spread).run_once()
    with nodes[2].client() as client:
        assert client.llen("rq:queue:c") == 1
        spread.cancel(s.id)
        assert spread.core.removals().flush()
        assert client.llen("rq:queue:c") == 0


def test_a_worker_whose_node_was_down_long_polls_it_at_most_every_two_seconds(
    spread: App, nodes: list[Node], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A worker's node down a long while: the worker tries it again at least every
    ``BACKOFF_CAP`` (2 s), not RQ's own backoff to a minute, so the node's jobs run
    within seconds of its return. Its waits are recorded and cut short here, so a long
    outage takes a moment. Seen failing with RQ's cap (waits of 4, 8, ... 60 s)."""
    slept: list[float] = []
    real_sleep = time.sleep

    class Clock:
        def __getattr__(self, name: str) -> Any:
            return getattr(time, name)

        def sleep(self, seconds: float) -> None:
            if threading.current_thread() is threading.main_thread():  # not the beat's
                slept.append(seconds)
            real_sleep(0.01)

    monkeypatch.setattr(redis_waits, "time", Clock())
    failures: list[BaseException] = []

    def outage() -> None:
        try:
            with nodes[1].client() as client:
                wait_for(lambda: client.scard("rq:workers") == 1, 30, "the worker to start")
            nodes[1].kill()
            wait_for(lambda: len(slept) >= 8, 60, "the worker to wait out the outage")
            nodes[1].start()
            spread.schedule("record", {}, delay=0, queue="b")
            Scheduler(spread).run_once()
            wait_for(lambda: _succeeded(spread, "b") == 1, 60, "b's job to run")
        except BaseException as exc:
            failures.append(exc)
        finally:
            if not nodes[1].answers():  # the worker would wait for it for good
                nodes[1].start()

    helper = threading.Thread(target=outage)
    runtime = Runtime(spread, WorkerConfig(heartbeat=timedelta(milliseconds=200)))
    try:
        helper.start()
        Worker(runtime, ["b"]).work(max_idle=5)  # it ends once idle 5 s after the job
    finally:
        helper.join(60)
        runtime.close()
    assert not failures, failures
    assert max(slept) <= 2.0, slept


def test_cancel_reschedule_and_a_paused_recurring_touch_only_their_queues_node(
    spread: App, nodes: list[Node]
) -> None:
    """With node b down, removing superseded jobs of queues a and c (cancel, reschedule, a
    recurring definition paused) reaches only their own nodes: no call to b, no error
    counted for it, no wait on it."""
    on_a = spread.schedule("record", {}, delay=0, queue="a")
    on_c = spread.schedule("record", {}, delay=0, queue="c")
    spread.recurring("every-minute", cron="* * * * *", type="record", queue="c")
    scheduler = Scheduler(spread)
    scheduler.recurring.run_once()
    scheduler.run_once()
    with nodes[0].client() as a, nodes[2].client() as c:  # pushed: there is something to remove
        assert a.llen("rq:queue:a") == 1
        assert c.llen("rq:queue:c") == 1 and c.zcard("rq:scheduled:c") >= 1
    nodes[1].kill()
    down = f"127.0.0.1:{nodes[1].port}/0"
    before = NODE_ERRORS.labels(down)._value.get()  # type: ignore[attr-defined]
    spread.cancel(on_a.id)
    spread.reschedule(on_c.id, delay=timedelta(hours=1))
    spread.pause_recurring("every-minute")
    assert spread.core.removals().flush()
    assert NODE_ERRORS.labels(down)._value.get() == before  # type: ignore[attr-defined]
    with nodes[0].client() as a, nodes[2].client() as c:
        assert a.llen("rq:queue:a") == 0
        assert c.llen("rq:queue:c") + c.zcard("rq:scheduled:c") == 0


def test_a_queue_moved_to_another_node_loses_nothing_and_runs_nothing_twice(
    app: App, database_url: str, nodes: list[Node]
) -> None:
    """Drain and switch: queue b's jobs wait on the first node; the mapping moves b to the
    second; the reconciler pushes the window there; workers on both nodes drain b."""
    before = register(App(database_url, nodes[0].url))
    after = register(App(database_url, nodes[0].url, redis_nodes={"b": nodes[1].url}))
    try:
        for i in range(20):
            before.schedule("record", {"i": i}, delay=timedelta(milliseconds=50 * i), queue="b")
        Scheduler(before).run_once()
        with nodes[0].client() as old, nodes[1].client() as new:
            assert old.llen("rq:queue:b") + old.zcard("rq:scheduled:b") == 20
            assert Reconciler(after).run_once().repushed == 20  # the window, on the new node
            assert new.llen("rq:queue:b") + new.zcard("rq:scheduled:b") == 20
        wait_for(lambda: after.now() > after.list().schedules[-1].due_at, 10, "all to fall due")
        Scheduler(after).run_once()  # promotes on both nodes
        _drain(before, "b")  # the old node's worker
        _drain(after, "b")  # the new node's
        assert _succeeded(after) == 20
        with after.engine.connect() as conn:
            ran = text("SELECT count(*), count(DISTINCT effect_key) FROM test_effects")
            assert tuple(conn.execute(ran).one()) == (20, 20)
        with nodes[0].client() as old, nodes[1].client() as new:
            left = [c.llen("rq:queue:b") + c.zcard("rq:scheduled:b") for c in (old, new)]
            assert left == [0, 0]
    finally:
        before.close()
        after.close()


def _drain_node(spawn: Callable[..., Proc], url: str, env: dict[str, str]) -> tuple[int, str]:
    proc = spawn("nodes", "drain", url, extra_env=env)
    code = proc.popen.wait(60)
    return code, proc.output()


def _left(node: Node, queue: str) -> int:
    with node.client() as client:
        return int(client.llen(f"rq:queue:{queue}") + client.zcard(f"rq:scheduled:{queue}"))


def test_the_documented_queue_move_leaves_nothing_on_a_node_that_left(
    app: App, database_url: str, nodes: list[Node], spawn: Callable[..., Proc]
) -> None:
    """docs/scaling.md's steps, literally: queue b lives on the second node, then moves to
    the third, and the second leaves the configuration with b's jobs waiting on it (queued
    and in its scheduled registry), one of them rescheduled after the move. ``duejobs nodes
    drain`` puts every delivery still wanted on the third node and leaves nothing on the
    second; the new node's workers run each job once. Before the command existed the second
    node kept its jobs for good."""
    before = register(App(database_url, nodes[0].url, redis_nodes={"b": nodes[1].url}))
    after = register(App(database_url, nodes[0].url, redis_nodes={"b": nodes[2].url}))
    try:
        made = [
            before.schedule("record", {"i": i}, delay=timedelta(milliseconds=100 * i), queue="b")
            for i in range(20)
        ]
        Scheduler(before).run_once()
        assert _left(nodes[1], "b") == 20
        # Steps 1 and 2: the services use the new mapping; one schedule changes after it.
        after.reschedule(made[0].id, delay=0)
        Scheduler(after).run_once()
        # Step 3.
        env = {"DUEJOBS_REDIS_URL": nodes[0].url, "DUEJOBS_REDIS_NODES": f"b={nodes[2].url}"}
        code, said = _drain_node(spawn, nodes[1].url, env)
        assert code == 0, said
        assert "19 pushed onto their queues' nodes, 1 no longer needed" in said, said
        assert _left(nodes[1], "b") == 0
        assert _left(nodes[2], "b") == 20
        # Step 4: nothing runs on the old node; the drain again finds nothing.
        assert "no job running" in said, said
        code, said = _drain_node(spawn, nodes[1].url, env)
        assert code == 0 and "nothing left behind" in said, said
        wait_for(lambda: after.now() > made[-1].due_at, 10, "every job to fall due")
        Scheduler(after).run_once()
        _drain(after, "b")
        assert _succeeded(after) == 20
        with after.engine.connect() as conn:
            ran = text("SELECT count(*), count(DISTINCT effect_key) FROM test_effects")
            assert tuple(conn.execute(ran).one()) == (20, 20)
        assert [_left(node, "b") for node in nodes] == [0, 0, 0]
    finally:
        before.close()
        after.close()


def _refusing_writes(node: Node, refusing: bool) -> None:
    """Node ``node`` refuses every write (out of memory, no eviction), or no longer."""
    with node.client() as client:
        client.config_set("maxmemory-policy", "noeviction")
        client.config_set("maxmemory", "1" if refusing else "0")


@pytest.mark.parametrize("failure", ["down", "refusing writes"])
def test_a_drain_whose_push_fails_takes_nothing_off_the_old_node(
    app: App, database_url: str, nodes: list[Node], spawn: Callable[..., Proc], failure: str
) -> None:
    """The new node is down, or answers but refuses writes, when the drain runs: it fails
    naming the node, and every job stays on the old node for the drain run once the new
    node takes them. Seen failing (refusing writes) with the check of the push removed:
    the push to a node that refuses leaves the other nodes going on, so the drain took the
    five jobs off the old node with none on the new one."""
    before = register(App(database_url, nodes[0].url, redis_nodes={"b": nodes[1].url}))
    try:
        for i in range(5):
            before.schedule("record", {"i": i}, delay=0, queue="b")
        Scheduler(before).run_once()
    finally:
        before.close()
    if failure == "down":
        nodes[2].kill()
    else:
        _refusing_writes(nodes[2], True)
    env = {"DUEJOBS_REDIS_URL": nodes[0].url, "DUEJOBS_REDIS_NODES": f"b={nodes[2].url}"}
    code, said = _drain_node(spawn, nodes[1].url, env)
    assert code == 1, said
    assert f"127.0.0.1:{nodes[2].port}/0" in said and "Traceback" not in said, said
    assert _left(nodes[1], "b") == 5
    if failure == "down":
        nodes[2].start()
    else:
        _refusing_writes(nodes[2], False)
    code, said = _drain_node(spawn, nodes[1].url, env)
    assert code == 0 and "5 pushed" in said, said
    assert (_left(nodes[1], "b"), _left(nodes[2], "b")) == (0, 5)


def test_a_drain_of_a_node_spelt_another_way_leaves_its_own_queues_alone(
    spread: App, nodes: list[Node], spawn: Callable[..., Proc]
) -> None:
    """The default node named ``localhost`` where the configuration says ``127.0.0.1``: the
    drain tells the servers apart by what they are, not by how their URLs are spelt, so the
    queues that live there keep their jobs. Seen failing when queues were compared by the
    address as spelt: every job of the default node was taken off."""
    for queue in ("a", "b"):
        spread.schedule("record", {}, delay=0, queue=queue)
    Scheduler(spread).run_once()
    env = {
        "DUEJOBS_REDIS_URL": nodes[0].url,
        "DUEJOBS_REDIS_NODES": f"b={nodes[1].url},c={nodes[2].url}",
    }
    code, said = _drain_node(spawn, f"redis://localhost:{nodes[0].port}/0", env)
    assert code == 0 and "nothing left behind" in said, said
    assert _left(nodes[0], "a") == 1


@pytest.mark.parametrize(
    ("spec", "named"),
    [
        ("a", "queue=url pairs"),
        ("a=redis://x:1/0 a=redis://y:2/0", "given twice"),
        ("a b=redis://x:1/0", "queue=url pairs"),
        ("a=http://x", "not a Redis URL"),
        ("=redis://x:1/0", "not a queue name"),
    ],
)
def test_a_node_table_that_cannot_work_is_refused(spec: str, named: str) -> None:
    with pytest.raises(ConfigurationError, match=named):
        parse_redis_nodes(spec)


@pytest.mark.parametrize(
    "spec",
    [
        "redis://:s3cret@host:6379/0",  # the queue forgotten
        "redis://:s3cret@host:6379/0?ssl_cert_reqs=none",  # ... with an = further on
        "a=redis://:s3cret@host:port/0",  # a port that is not a number
    ],
)
def test_a_password_in_a_node_url_never_reaches_a_refusal(spec: str) -> None:
    with pytest.raises(ConfigurationError) as refused:
        parse_redis_nodes(spec)
    assert "s3" not in str(refused.value) and "cret" not in str(refused.value)


def test_a_comma_in_a_node_urls_password_stays_in_the_password() -> None:
    """A comma separates two pairs only before ``queue=``: elsewhere (a password, the
    Sentinels of a Sentinel URL) it belongs to the URL."""
    assert parse_redis_nodes("a=redis://:s3,cret@host:6379/0,b=redis://h2/0") == (
        ("a", "redis://:s3,cret@host:6379/0"),
        ("b", "redis://h2/0"),
    )


WORKER = ["worker", "--app", "tests.support.apps:app", "--log-level", "warning"]


def test_a_node_killed_midway_loses_nothing_and_holds_up_no_other_node(
    spread: App, nodes: list[Node], spawn: Callable[..., Proc]
) -> None:
    """One scheduler, one reconciler and a worker per node deliver jobs due over several
    seconds; node b is killed with jobs on it and restarted empty. Queues a and c go on
    while b is down, b's jobs are pushed again once it is back, and every job runs once."""
    n = 60
    for i in range(n):
        queue = QUEUES[i % 3]
        spread.schedule("record", {"i": i}, delay=timedelta(milliseconds=200 * i), queue=queue)
    env = {
        "DUEJOBS_REDIS_URL": nodes[0].url,
        "DUEJOBS_REDIS_NODES": f"b={nodes[1].url},c={nodes[2].url}",
    }
    spawn("scheduler", "--poll-interval", "0.05", "--log-level", "warning", extra_env=env)
    spawn("reconcile", "--every", "1s", "--log-level", "warning", extra_env=env)
    for queue in QUEUES:
        spawn(*WORKER, "--queue", queue, extra_env=env)
    wait_for(lambda: _succeeded(spread, "b") >= 3, 60, "node b's first jobs to run")
    nodes[1].kill()
    killed_at = spread.now()
    wait_for(  # jobs that fell due after the kill: promoted and run without node b
        lambda: all(_succeeded(spread, q, due_after=killed_at) >= 3 for q in ("a", "c")),
        60,
        "queues a and c to go on while node b is down",
    )
    assert _succeeded(spread, "b", due_after=killed_at) == 0
    nodes[1].start()
    wait_for(lambda: _succeeded(spread) == n, 120, f"all {n} jobs to run once node b is back")
    with spread.engine.connect() as conn:
        ran = text("SELECT count(*), count(DISTINCT effect_key) FROM test_effects")
        assert tuple(conn.execute(ran).one()) == (n, n)
