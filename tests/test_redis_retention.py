"""Nothing duejobs writes to Redis grows for ever: with a short ``result_ttl`` and only a
scheduler, a worker and a reconciler running as documented, each of RQ's structures is empty
again once its entries expire.

Each test here waits out a real TTL (2 s) and a reconciler pass (every 1 s), then polls with a
deadline: about 2 to 4 s each. Seen failing on the code before the cleanup (the registries and
the worker sets kept every entry), with the worker writing finished jobs with a fixed TTL
(``result_ttl`` not read), and with the cleanup taking a live worker's started entry.
"""

from __future__ import annotations

import signal
import uuid
from collections.abc import Callable
from datetime import timedelta

import pytest
import redis
from rq import Queue
from rq.serializers import JSONSerializer
from rq.worker_registration import REDIS_WORKER_KEYS, WORKERS_BY_QUEUE_KEY

from duejobs import App
from duejobs.config import RESULT_TTL_ENV
from duejobs.delivery import registries
from duejobs.errors import ConfigurationError
from duejobs.services.reconciler import Reconciler
from tests.support import wait_for
from tests.support.cli import run
from tests.support.processes import SCHEDULER, Proc
from tests.support.system import System

TTL = 2
WORKER = ["worker", "--app", "tests.support.apps:app", "--log-level", "warning"]
RECONCILER = ["reconcile", "--every", "1", "--log-level", "warning"]
# What stays in Redis, whatever ran: the lists of queues, the worker sets and keys of live
# workers, and the queues' own (empty lists are no keys); a wake of the scheduler not yet taken
# (one entry, expiring: tests/test_delivery_path.py).
BOUNDED = (
    "rq:queues",
    "duejobs:queues",
    REDIS_WORKER_KEYS,
    "rq:workers:",
    "rq:worker:",
    "duejobs:wake:",
)


def _keys(client: redis.Redis, pattern: str) -> list[str]:
    return [k.decode() for k in client.scan_iter(match=pattern, count=1000)]


def _services(spawn: Callable[..., Proc], *, worker: bool = True) -> Proc | None:
    ttl = {RESULT_TTL_ENV: str(TTL)}
    spawn(*SCHEDULER, extra_env=ttl)
    spawn(*RECONCILER, extra_env=ttl)
    return spawn(*WORKER, extra_env=ttl) if worker else None


def _schedule(system: System, job_type: str, n: int) -> list[uuid.UUID]:
    return [system.app.schedule(job_type, {}, delay=timedelta(0)).id for _ in range(n)]


def test_finished_jobs_leave_their_registry_hashes_and_results_once_their_ttl_passes(
    system: System, spawn: Callable[..., Proc]
) -> None:
    ids = _schedule(system, "record", 50)
    _services(spawn)
    wait_for(lambda: all(system.status(i) == "succeeded" for i in ids), 60, "every job to run")
    finished = "rq:finished:duejobs"
    wait_for(lambda: system.redis.zcard(finished) == 0, 30, "the finished registry to empty")
    wait_for(lambda: not _keys(system.redis, "rq:job:*"), 30, "the job hashes to expire")
    wait_for(lambda: not _keys(system.redis, "rq:results:*"), 30, "the results to expire")
    left = [k for k in _keys(system.redis, "*") if not k.startswith(BOUNDED)]
    assert left == [], left


def test_failed_jobs_leave_the_failed_registry_once_their_ttl_passes(
    system: System, spawn: Callable[..., Proc]
) -> None:
    # A job a duejobs worker cannot read fails in RQ (as does one whose delivery raised).
    queue = Queue("duejobs", connection=system.redis, serializer=JSONSerializer)
    jobs = [queue.enqueue("os.getcwd") for _ in range(20)]
    _services(spawn)
    failed = "rq:failed:duejobs"
    wait_for(
        lambda: all(j.get_status(refresh=True) in ("failed", None) for j in jobs),
        30,
        "every job to fail in RQ",
    )
    wait_for(lambda: system.redis.zcard(failed) == 0, 30, "the failed registry to empty")
    wait_for(lambda: not _keys(system.redis, "rq:job:*"), 30, "their hashes to expire")


def test_a_sigkilled_workers_places_in_the_worker_sets_and_its_started_jobs_are_removed(
    system: System, spawn: Callable[..., Proc]
) -> None:
    s = system.app.schedule("stall-once", {"seconds": 120}, delay=0)
    worker = _services(spawn)
    assert worker is not None
    wait_for(lambda: system.status(s.id) == "running", 30, "the job to start")
    started = "rq:wip:duejobs"
    (member,) = system.redis.zrange(started, 0, -1)
    (worker_key,) = system.redis.smembers(REDIS_WORKER_KEYS)
    worker.stop(signal.SIGKILL)
    # What 480 s of the dead worker's silence does: its key expires, its started entry is
    # no longer pushed back (RQ's worker_ttl; no test waits that long).
    system.redis.pexpire(worker_key, 1)
    system.redis.zadd(started, {member: 0}, xx=True)
    wait_for(
        lambda: (
            not system.redis.smembers(REDIS_WORKER_KEYS)
            and not system.redis.smembers(WORKERS_BY_QUEUE_KEY % "duejobs")
        ),
        30,
        "the dead worker to leave the worker sets",
    )
    wait_for(lambda: system.redis.zcard(started) == 0, 30, "its started entry to go")
    job_id = member.decode().rsplit(":", 1)[0]
    assert system.redis.hget(f"rq:job:{job_id}", "status") in (b"failed", None)
    assert 0 < system.redis.ttl(f"rq:job:{job_id}") <= TTL or not system.redis.exists(
        f"rq:job:{job_id}"
    )


def test_a_live_workers_started_entry_is_left_alone_whatever_its_score(
    system: System, spawn: Callable[..., Proc]
) -> None:
    s = system.app.schedule("stall-once", {"seconds": 120}, delay=0)
    spawn(*SCHEDULER)
    spawn(*WORKER)
    wait_for(lambda: system.status(s.id) == "running", 30, "the job to start")
    started = "rq:wip:duejobs"
    (member,) = system.redis.zrange(started, 0, -1)
    system.redis.zadd(started, {member: 0}, xx=True)  # its worker's clock far behind Redis'
    for _ in range(3):
        assert Reconciler(system.app).run_once().abandoned_removed == 0
    assert system.redis.zrange(started, 0, -1) == [member]
    assert system.redis.hget(f"rq:job:{member.decode().rsplit(':', 1)[0]}", "status") == b"started"


@pytest.mark.parametrize("bad", [0, -5, 1.5, "fast", True, timedelta(milliseconds=1500)])
def test_a_bad_result_ttl_is_refused_naming_it(database_url: str, bad: object) -> None:
    with pytest.raises(ConfigurationError, match=r"result_ttl \(DUEJOBS_RESULT_TTL\)"):
        App(database_url=database_url, result_ttl=bad)  # type: ignore[arg-type]


def test_a_bad_result_ttl_on_the_command_line_or_in_the_environment_is_refused_naming_it(
    env: dict[str, str],
) -> None:
    given = run("--result-ttl", "0", "stats", env=env)
    assert given.returncode == 2 and "--result-ttl" in given.stderr, given.stderr
    from_env = run("stats", env={**env, RESULT_TTL_ENV: "forever"})
    # a configuration error, as every variable's (exit 1)
    assert from_env.returncode == 1 and RESULT_TTL_ENV in from_env.stderr, from_env.stderr


def test_a_registry_that_grew_without_a_reconciler_is_emptied_in_bounded_calls(
    system: System, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Thousands of entries expired while no reconciler ran: each script call removes at
    most its batch (Redis is never blocked by one long call), and the cleanup calls again
    until they are gone."""
    system.redis.zadd("rq:finished:duejobs", {f"gone-{i}": 1 for i in range(2500)})
    system.redis.zadd("rq:finished:duejobs", {"kept": 2**40})  # not expired
    system.redis.sadd("duejobs:queues", "duejobs")
    deliverer = system.app.core.deliverer()
    calls: list[int] = []
    for node in deliverer._nodes:
        real = node.clean

        def counted(*args: object, real: object = real, **kwargs: object) -> object:
            answer = real(*args, **kwargs)  # type: ignore[operator]
            calls.append(int(answer[0]))
            return answer

        monkeypatch.setattr(node, "clean", counted)
    done = registries.clean(deliverer, most=1000)
    assert done.expired == 2500 and calls == [1000, 1000, 500]
    assert system.redis.zrange("rq:finished:duejobs", 0, -1) == [b"kept"]
