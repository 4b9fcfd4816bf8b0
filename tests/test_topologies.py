"""The promises as deployed: a seeded workload through PgBouncer (transaction and session
mode) and through a failover pair (a streaming standby promoted after its primary is
killed), with the services as processes and a fault in the middle. Each counts lost
schedules, handlers run twice, early starts and services that exited, and prints the time
from the fault to the first job finished after it (docs/deployment.md, docs/benchmarks.md).

Each takes 10-20 s: a few seconds of schedules, the fault, and the recovery waited for. They
run beside the others (pytest-xdist): each acts on servers of its own (a PgBouncer, a pair of
servers) or on its own database.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from sqlalchemy import text

from duejobs import App
from duejobs.config import sqlalchemy_url
from duejobs.core import make_engine
from duejobs.store.migrate import upgrade
from tests.support.apps import EFFECTS_TABLE, RUNS_TABLE
from tests.support.pgbouncer import start_pgbouncer
from tests.support.processes import Proc
from tests.support.replication import Pair, streaming_pair
from tests.support.servers import Servers
from tests.support.topology import report, run_workload


def _end_every_session(url: str) -> None:
    """Every session on the database ended (``pg_terminate_backend``), idle or not."""
    engine = make_engine(sqlalchemy_url(url))
    try:
        with engine.begin() as conn:
            conn.execute(
                text(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                    "WHERE datname = current_database() AND pid <> pg_backend_pid()"
                )
            )
    finally:
        engine.dispose()


@pytest.mark.parametrize(
    ("mode", "pool"),
    [
        ("transaction", 20),
        # a pool of 60 sessions filled and restarted, 15 s: make test-long (test-all)
        pytest.param("session", 60, marks=pytest.mark.long),
    ],
)
def test_through_pgbouncer_a_pooler_restart_and_ended_sessions_lose_nothing(
    mode: str,
    pool: int,
    servers: Servers,
    database_url: str,
    app: App,
    spawn: Callable[..., Proc],
    capsys: pytest.CaptureFixture[str],
) -> None:
    with start_pgbouncer(servers.server_url, mode, pool_size=pool) as bouncer:

        def fault() -> None:
            bouncer.restart()
            time.sleep(1)
            _end_every_session(database_url)

        counts = run_workload(
            spawn, bouncer.url_for(servers.database), database_url, fault, seed=45
        )
    report(capsys, f"PgBouncer 1.18, {mode} mode", counts)
    assert (counts.lost, counts.twice, counts.rescued, counts.early) == (0, 0, 0, 0), (
        counts.evidence
    )
    assert counts.exited == []


@pytest.fixture
def failover_pair(tmp_path: Path, synchronous: bool) -> Iterator[Pair]:
    with streaming_pair(tmp_path / "pair", synchronous=synchronous) as made:
        engine = make_engine(sqlalchemy_url(made.primary_url))
        upgrade(engine)
        with engine.begin() as conn:
            conn.execute(text(EFFECTS_TABLE))
            conn.execute(text(RUNS_TABLE))
        engine.dispose()
        yield made


@pytest.mark.parametrize("synchronous", [True, False], ids=["synchronous", "asynchronous"])
def test_a_primary_killed_and_its_standby_promoted_lose_nothing(
    synchronous: bool,
    failover_pair: Pair,
    redis_client: object,
    spawn: Callable[..., Proc],
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Synchronous, with durable bookkeeping: nothing acknowledged is lost with the primary.
    Asynchronous: what the standby had not received is gone with it; a schedule whose claim
    or outcome was among it runs again (rescued, or claimed again): the documented exception,
    counted, not held to zero. Either way none is lost, none starts early."""
    pair = failover_pair

    def fault() -> float:
        pair.crash_primary()
        pair.promote_standby()
        return pair.accepting_writes()

    flags = ("--durable-bookkeeping",) if synchronous else ()
    url = pair.failover_url
    counts = run_workload(spawn, url, url, fault, seed=46, worker_flags=flags)
    name = "synchronous standby, durable bookkeeping" if synchronous else "asynchronous standby"
    report(capsys, f"failover, {name}", counts)
    assert (counts.lost, counts.early) == (0, 0), counts.evidence
    if synchronous:
        assert (counts.twice, counts.rescued) == (0, 0), counts.evidence
    assert counts.exited == []


def test_the_worker_says_when_a_failover_can_lose_its_outcomes(
    tmp_path: Path, redis_client: object, spawn: Callable[..., Proc]
) -> None:
    with streaming_pair(tmp_path / "pair", synchronous=True) as pair:
        upgrade(make_engine(sqlalchemy_url(pair.primary_url)))
        env = {"DUEJOBS_DATABASE_URL": pair.primary_url}
        quiet = spawn(
            "worker",
            "--app",
            "tests.support.apps:app",
            "--burst",
            "--durable-bookkeeping",
            extra_env=env,
        )
        warned = spawn("worker", "--app", "tests.support.apps:app", "--burst", extra_env=env)
        assert quiet.popen.wait(60) == 0 and warned.popen.wait(60) == 0
    assert "synchronous standbys" in warned.output()
    assert "synchronous standbys" not in quiet.output()
