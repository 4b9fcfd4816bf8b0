"""Bulk scheduling: `app.schedule_many` beside a raw COPY of the same rows, in one run.

BULK_ROWS (100,000) schedules across 10 tenants, due over the next day:

* baseline — psycopg's binary COPY (its C adapters) of the finished rows straight into
  `scheduled_jobs` (id, tenant, type, payload, run_at, due_at), then COMMIT: the fastest a
  client can put them in the table (text COPY is slower on both sides), with no validation,
  no history and no key handling; its ids are time-ordered like duejobs' own (random ones
  cost PostgreSQL a third more);
* duejobs — `app.schedule_many(requests)` with the same requests built beforehand: every
  check `schedule()` makes, a binary COPY of the rows fed while the requests are validated,
  one INSERT ... SELECT writing each row's `created` event, COMMIT.

Also: the round trips one `schedule()` sends, COMMIT included (every statement and commit
psycopg sends, counted at psycopg so duejobs' own straight-to-psycopg path counts too; pool
warm, no quota), beside a bare INSERT of the row and its COMMIT counted the same way: the
insert with its `created` event is one statement, then the commit.

Also: `duejobs prune` (batches of 1,000 finished schedules, each with its events and attempts,
one short transaction each) beside one DELETE of the same rows in one transaction — the rate
the command reports, and what the batching costs.

Both sides run BULK_ROUNDS (5) times, alternated, into an emptied table after a CHECKPOINT;
each side's median round counts (on a shared, noisy machine one round in five may be much
faster or slower than the rest, on either side).

Target: schedule_many >= 0.5x the raw COPY's rows/s.

    python -m bench.bulk
"""

from __future__ import annotations

import contextlib
import json
import os
import statistics
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
from psycopg.types.json import set_json_dumps
from sqlalchemy import text

from bench.common import TABLES, Figure
from duejobs import App, ScheduleRequest
from duejobs.ids import id_stream
from duejobs.services.pruner import PruneConfig, Pruner

ROWS = int(os.environ.get("BULK_ROWS", "100000"))
PRUNED = int(os.environ.get("PRUNE_ROWS", "100000"))
ROUNDS = int(os.environ.get("BULK_ROUNDS", "5"))


def _truncate(url: str) -> None:
    """Empty the tables, and write out every dirty page so no round pays for another's."""
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f"TRUNCATE {TABLES}")
        conn.execute("CHECKPOINT")


def _requests(start: datetime) -> list[ScheduleRequest]:
    return [
        ScheduleRequest(
            "remind",
            {"user": i, "message": "your booking starts soon"},
            run_at=start + timedelta(seconds=i % 86_400),
            tenant=f"t{i % 10}",
        )
        for i in range(ROWS)
    ]


def raw_copy(url: str, requests: list[ScheduleRequest]) -> float:
    rows = [
        (uuid.UUID(bytes=sid), r.tenant, r.type, json.dumps(r.payload), r.run_at, r.run_at)
        for r, sid in zip(requests, id_stream(), strict=False)
    ]
    with psycopg.connect(url) as conn:
        started = time.perf_counter()
        cursor = conn.cursor()
        set_json_dumps(str, cursor)  # payloads are JSON text already, encoded beforehand
        with (
            cursor,
            cursor.copy(
                "COPY scheduled_jobs (id, tenant, type, payload, run_at, due_at) FROM STDIN "
                "(FORMAT BINARY)"
            ) as copy,
        ):
            copy.set_types(["uuid", "text", "text", "jsonb", "timestamptz", "timestamptz"])
            for row in rows:
                copy.write_row(row)
        conn.commit()
        return time.perf_counter() - started


def bulk(app: App, requests: list[ScheduleRequest]) -> float:
    started = time.perf_counter()
    ids = app.schedule_many(requests)
    elapsed = time.perf_counter() - started
    assert len(set(ids)) == ROWS
    return elapsed


@contextlib.contextmanager
def _counting_round_trips() -> Iterator[list[str]]:
    """Every statement psycopg sends, and every commit, whoever asks for it (SQLAlchemy or
    duejobs' own straight-to-psycopg path): what crosses the wire."""
    sent: list[str] = []
    execute, commit = psycopg.Cursor.execute, psycopg.Connection.commit

    def counted_execute(self: Any, query: Any, *args: Any, **kwargs: Any) -> Any:
        sent.append(str(query)[:40])
        return execute(self, query, *args, **kwargs)

    def counted_commit(self: Any) -> None:
        sent.append("COMMIT")
        commit(self)

    psycopg.Cursor.execute = counted_execute  # type: ignore[method-assign]
    psycopg.Connection.commit = counted_commit  # type: ignore[method-assign]
    try:
        yield sent
    finally:
        psycopg.Cursor.execute = execute  # type: ignore[method-assign]
        psycopg.Connection.commit = commit  # type: ignore[method-assign]


_HAND_WRITTEN = text(
    "INSERT INTO scheduled_jobs (id, type, payload, run_at, due_at) "
    "VALUES (:id, 'remind', '{}', now() + interval '1 minute', now() + interval '1 minute')"
)


def statements_per_schedule(app: App) -> tuple[float, float]:
    """Round trips of one ``schedule()`` (history included), and of the hand-written minimum
    (one INSERT of the row and its COMMIT) on the same warm pool, counted the same way."""
    app.schedule("remind", {}, delay=60)  # warm the pool
    with _counting_round_trips() as ours:
        for _ in range(10):
            app.schedule("remind", {}, delay=60)
    with _counting_round_trips() as theirs:
        for _ in range(10):
            with app.engine.begin() as conn:
                conn.execute(_HAND_WRITTEN, {"id": uuid.uuid4()})
    return len(ours) / 10, len(theirs) / 10


def _finished(url: str, n: int) -> None:
    """``n`` schedules that succeeded 60 days ago, each with four events and an attempt."""
    with psycopg.connect(url) as conn:
        conn.execute(f"TRUNCATE {TABLES}")
        conn.execute(
            "INSERT INTO scheduled_jobs (id, tenant, type, payload, run_at, due_at, status, "
            "finished_at) SELECT gen_random_uuid(), 'default', 'remind', '{}', t, t, "
            "'succeeded', t FROM (SELECT now() - interval '60 days' AS t "
            "FROM generate_series(1, %s)) AS d",
            (n,),
        )
        conn.execute(
            "INSERT INTO scheduled_job_events (schedule_id, tenant, kind, version) "
            "SELECT id, tenant, k, 1 FROM scheduled_jobs, "
            "unnest(ARRAY['created', 'enqueued', 'started', 'succeeded']) AS k"
        )
        conn.execute(
            "INSERT INTO scheduled_job_attempts (schedule_id, tenant, version, attempt, status) "
            "SELECT id, tenant, 1, 1, 'succeeded' FROM scheduled_jobs"
        )
        conn.execute("ANALYZE")


def prune_rates(url: str, app: App) -> tuple[float, float]:
    """(rows/s of `duejobs prune`'s batches of 1,000, rows/s of one DELETE of them all)."""
    _finished(url, PRUNED)
    started = time.perf_counter()
    assert Pruner(app, PruneConfig(batch_size=1000)).run_once().deleted == PRUNED
    ours = PRUNED / (time.perf_counter() - started)
    _finished(url, PRUNED)
    with psycopg.connect(url) as conn:
        started = time.perf_counter()
        conn.execute("DELETE FROM scheduled_job_events")
        conn.execute("DELETE FROM scheduled_jobs WHERE status = 'succeeded'")
        conn.commit()
        theirs = PRUNED / (time.perf_counter() - started)
    return ours, theirs


def run(database_url: str, redis_url: str) -> list[Figure]:
    app = App(database_url=database_url, redis_url=redis_url)
    try:
        start = datetime.now(UTC) + timedelta(days=1)
        requests = _requests(start)
        copies: list[float] = []
        ours: list[float] = []
        for _ in range(ROUNDS):  # alternated; each side's median round counts
            _truncate(database_url)
            copies.append(raw_copy(database_url, requests))
            _truncate(database_url)
            ours.append(bulk(app, requests))
        copy_s, ours_s = statistics.median(copies), statistics.median(ours)
        _truncate(database_url)
        per_call, minimum = statements_per_schedule(app)
        pruned, deleted = prune_rates(database_url, app)
        _truncate(database_url)
    finally:
        app.close()
    return [
        Figure(
            f"bulk: schedule_many of {ROWS:,} (raw COPY beside)",
            ROWS / ours_s,
            ROWS / copy_s,
            "rows/s",
            ">= 0.5x raw COPY",
            ROWS / ours_s >= 0.5 * ROWS / copy_s,
        ),
        Figure(
            "bulk: round trips per schedule() incl. COMMIT (bare INSERT beside)",
            per_call,
            minimum,
            "trips",
            "<= 1.0x a bare INSERT + COMMIT",
            per_call <= minimum,
        ),
        Figure(
            f"prune: {PRUNED:,} finished, batches of 1,000 (one DELETE beside)",
            pruned,
            deleted,
            "rows/s",
            ">= 0.3x one DELETE (short locks)",
            pruned >= 0.3 * deleted,
        ),
    ]


if __name__ == "__main__":
    from bench.common import scratch_database

    with scratch_database() as (db, rd):
        for figure in run(db, rd):
            print(figure.line(), flush=True)
