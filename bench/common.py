"""What every benchmark shares: the servers to run against and a scratch database."""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import psycopg
from psycopg import sql

from duejobs.config import DATABASE_ENV, REDIS_ENV, libpq_url, sqlalchemy_url
from duejobs.core import make_engine
from duejobs.dev.embedded import start_embedded
from duejobs.store.migrate import upgrade


@contextmanager
def empty_database(server: str, prefix: str) -> Iterator[str]:
    """The libpq URL of a new, empty database named ``prefix`` plus a random suffix on the
    server at ``server`` (a libpq URL), dropped afterwards."""
    name = f"{prefix}_{uuid.uuid4().hex[:8]}"
    head, _, query = server.partition("?")
    url = f"{head.rsplit('/', 1)[0]}/{name}" + (f"?{query}" if query else "")
    with psycopg.connect(server, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    try:
        yield url
    finally:
        with psycopg.connect(server, autocommit=True) as conn:
            conn.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
            )


@contextmanager
def scratch_database() -> Iterator[tuple[str, str]]:
    """(database URL, Redis URL): a fresh, migrated database on the configured or embedded
    server, dropped afterwards."""
    server, redis_url = os.environ.get(DATABASE_ENV), os.environ.get(REDIS_ENV)
    embedded = None
    if not (server and redis_url):
        embedded = start_embedded(Path(".duejobs"))
        server, redis_url = embedded.database_url, embedded.redis_url
    try:
        with empty_database(libpq_url(server), "duejobs_bench") as url:
            engine = make_engine(sqlalchemy_url(url))
            upgrade(engine)
            engine.dispose()
            yield url, redis_url
    finally:
        if embedded is not None:
            embedded.stop()


# Every duejobs table a benchmark empties between runs (events carry no foreign key, so
# truncating scheduled_jobs alone would leave them behind).
TABLES = (
    "scheduled_jobs, scheduled_job_events, scheduled_job_attempts, scheduled_job_effects, "
    "scheduled_job_results, recurring_schedules, tenant_quotas, rate_limits"
)


def wait_until(
    condition: Callable[[], bool], timeout: float, what: str, every: float = 0.2
) -> None:
    """Poll ``condition`` every ``every`` seconds; TimeoutError naming ``what`` past the
    deadline."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} not done in {timeout:.0f} s")
        time.sleep(every)


def percentile(values: list[float], q: float) -> float:
    """The ``q`` quantile of ``values``, nearest rank."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


@dataclass(frozen=True)
class Figure:
    """One measured figure beside its baseline from the same run."""

    name: str
    value: float
    baseline: float
    unit: str
    target: str
    ok: bool

    @property
    def ratio(self) -> float:
        return self.value / self.baseline if self.baseline else float("nan")

    def line(self) -> str:
        verdict = "ok  " if self.ok else "MISS"
        return (
            f"{verdict} {self.name:<52} {self.value:>10.1f} {self.unit:<7} "
            f"baseline {self.baseline:>10.1f}  ratio {self.ratio:5.2f}  target {self.target}"
        )


def fill_due(
    url: str,
    n: int,
    *,
    job_type: str,
    offset: str = "0 seconds",
    spread: str = "0 seconds",
    background: int = 0,
    queues: Sequence[str] = (),
) -> None:
    """``n`` scheduled rows due at now() + offset (+ up to ``spread``), on ``queues`` in turn
    (else the default queue), plus ``background`` rows that are finished or far in the
    future; tables are emptied first."""
    with psycopg.connect(url) as conn:
        conn.execute(f"TRUNCATE {TABLES}")
        routed = ", queue" if queues else ""  # else the column's default
        conn.execute(
            f"INSERT INTO scheduled_jobs (id, type, payload, run_at, due_at{routed}) "
            f"SELECT gen_random_uuid(), %(type)s, '{{}}', t, t{routed} FROM ("
            "  SELECT now() + %(offset)s::interval + random() * %(spread)s::interval AS t, "
            "  (%(queues)s::text[])[1 + g %% greatest(cardinality(%(queues)s::text[]), 1)] "
            "  AS queue FROM generate_series(1, %(n)s) AS g) AS d",
            {"type": job_type, "offset": offset, "spread": spread, "n": n, "queues": list(queues)},
        )
        if background:
            conn.execute(
                "INSERT INTO scheduled_jobs (id, type, payload, run_at, due_at, status) "
                "SELECT gen_random_uuid(), %(type)s, '{}', t, t, "
                "CASE WHEN g %% 2 = 0 THEN 'scheduled' ELSE 'succeeded' END FROM ("
                "  SELECT g, now() + interval '2 days' + g * interval '1s' AS t "
                "  FROM generate_series(1, %(n)s) AS g) AS d",
                {"type": job_type, "n": background},
            )
        conn.execute("ANALYZE scheduled_jobs")
