"""duejobs on a Redis Cluster of three masters and three replicas started by the test, through
its URL (``redis+cluster://``): the scheduler, an 8-slot worker and the reconciler over six
queues spread on every shard, each job run once and none early; and the URL's mistakes
refused, its password never shown.

Seen failing, all five, before the URL was known ("not a Redis URL"; the path's parts before
they knew a cluster: tests/test_cluster_delivery.py, tests/test_cluster_wire.py)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from datetime import timedelta
from urllib.parse import urlsplit

import pytest
from sqlalchemy import text

from duejobs import App
from duejobs.errors import ConfigurationError
from duejobs.redis_urls import redacted_redis, same_redis
from duejobs.rq_wire.keys import queue_keys, rq_name
from duejobs.scheduler.loop import Scheduler, SchedulerConfig
from duejobs.services.reconciler import Reconciler
from duejobs.worker import Runtime, Worker, WorkerConfig
from tests.support import wait_for
from tests.support.apps import register
from tests.support.cluster import QUEUES, Cluster
from tests.support.network import free_ports
from tests.support.processes import Proc

PER_QUEUE = 5


@pytest.fixture
def clustered(app: App, database_url: str, redis_cluster: Cluster) -> Iterator[App]:
    """An App on the test's tables (emptied by ``app``) and the cluster, through its URL."""
    redis_cluster.client().flushall(target_nodes="primaries")
    made = App(database_url=database_url, redis_url=redis_cluster.url)
    register(made)
    yield made
    made.close()


def _effects(app: App) -> list[tuple[str, int]]:
    with app.engine.connect() as conn:
        rows = conn.execute(text("SELECT effect_key, attempt FROM test_effects"))
        return [(r.effect_key, r.attempt) for r in rows]


def test_jobs_of_six_queues_run_once_each_on_a_cluster_none_early(
    clustered: App, redis_cluster: Cluster
) -> None:
    scheduled = [
        clustered.schedule("record", {"n": n}, delay=0.3 * (n % 2), queue=queue)
        for queue in QUEUES
        for n in range(PER_QUEUE)
    ]
    scheduler = Scheduler(clustered, SchedulerConfig(poll_interval=timedelta(milliseconds=50)))
    runtimes: list[Runtime] = []

    def done() -> bool:
        """A scheduler pass, then a worker of 8 slots over the six queues, drained."""
        scheduler.run_once()
        runtime = Runtime(clustered, WorkerConfig(concurrency=8, heartbeat=timedelta(seconds=1)))
        runtimes.append(runtime)
        Worker(runtime, QUEUES).work(burst=True)
        return all(clustered.get(s.id).status.value == "succeeded" for s in scheduled)  # type: ignore[union-attr]

    try:
        wait_for(done, 30, "every job to succeed")
        Reconciler(clustered).run_once()
    finally:
        for runtime in runtimes:
            runtime.close()
    shards = redis_cluster.client()
    for queue in QUEUES:  # finished in RQ's registry of the queue, on its shard
        assert shards.zcard(queue_keys(rq_name(queue, True)).finished) == PER_QUEUE
    effects = _effects(clustered)
    assert len(effects) == len(scheduled) and len(set(effects)) == len(scheduled)
    with clustered.engine.connect() as conn:
        early = conn.execute(
            text(
                "SELECT count(*) FROM scheduled_job_attempts a JOIN scheduled_jobs s "
                "ON s.id = a.schedule_id WHERE a.started_at < s.due_at"
            )
        ).scalar_one()
    assert early == 0


def test_a_cluster_url_names_its_nodes_and_hides_its_password() -> None:
    url = "redis+cluster://:s3cret@10.0.0.1:7000,10.0.0.2:7001"
    assert "s3cret" not in redacted_redis(url)
    assert same_redis(url) == same_redis("redis+cluster://:other@10.0.0.2:7001,10.0.0.1:7000")


@pytest.mark.parametrize(
    ("url", "names"),
    [
        ("redis+cluster://:s3cret@10.0.0.1:7000/3", "one database, 0"),
        ("redis+cluster://:s3cret@10.0.0.1:port", "bad node"),
    ],
)
def test_a_bad_cluster_url_is_refused_naming_the_problem_not_the_password(
    database_url: str, url: str, names: str
) -> None:
    with pytest.raises(ConfigurationError, match=names) as refused:
        App(database_url=database_url, redis_url=url)
    assert "s3cret" not in str(refused.value)


def test_a_node_mapping_beside_a_cluster_is_refused(database_url: str) -> None:
    with pytest.raises(ConfigurationError, match="DUEJOBS_REDIS_NODES"):
        App(
            database_url=database_url,
            redis_url="redis+cluster://10.0.0.1:7000",
            redis_nodes={"mail": "redis://10.0.0.9:6379/0"},
        )


def test_a_cluster_url_naming_a_server_that_is_no_cluster_ends_a_service_naming_it(
    spawn: Callable[..., Proc], redis_url: str
) -> None:
    """No retry mends it: exit 2 at the start, naming the Redis (no password) and what it
    answered. Seen failing with the start's check letting redis-py's cluster errors through:
    a traceback, exit 1."""
    parts = urlsplit(redis_url)
    if parts.port is None:
        pytest.skip("the suite's Redis listens on no TCP port")
    url = f"redis+cluster://:s3cret@{parts.hostname}:{parts.port}"
    scheduler = spawn("scheduler", extra_env={"DUEJOBS_REDIS_URL": url})
    assert scheduler.ended() == 2, scheduler.output()
    said = scheduler.output()
    assert "refuses duejobs" in said and "Cluster mode is not enabled" in said, said
    assert "s3cret" not in said and "Traceback" not in said


def test_a_worker_stopped_while_its_cluster_is_away_ends_at_once_and_cleanly(
    spawn: Callable[..., Proc],
) -> None:
    """A worker waiting for its cluster's first answer, SIGTERMed: it ends with 0, having
    written nothing. Seen failing with its retirement making the cluster's client outside
    the outage's wait: "ended by RedisClusterUnreachableError", exit 1."""
    port = free_ports(1)[0]
    worker = spawn(
        "worker",
        "--app",
        "tests.support.apps:app",
        extra_env={"DUEJOBS_REDIS_URL": f"redis+cluster://127.0.0.1:{port}"},
    )
    wait_for(lambda: "did not answer" in worker.output(), 30, "the worker to wait for Redis")
    assert worker.stop() == 0, worker.output()
    assert "Traceback" not in worker.output()
