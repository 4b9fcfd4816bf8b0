"""Partitioned mode's plans: the claim reads each tenant's own index on a busy partition,
keeps its generic plan as a partition planned empty fills, plans once per connection, and
every hot statement reads indexes on every partition. Each test on a schema of its own
(:mod:`tests.support.partitions`).
"""

from __future__ import annotations

import re
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from psycopg import sql
from sqlalchemy import Connection, text

from duejobs import App, store
from duejobs.ids import first_id_at
from duejobs.scheduler.claim import claim_due
from duejobs.store.partitions import PARTITIONED, partition_name
from duejobs.store.queries import in_schema
from tests.support.partitions import DAILY, id_at, past_partitions, schema_tx
from tests.support.partitions import parted as parted
from tests.support.plans import full_scans, reads_index


def _rows_at(conn: Connection, n: int, start: datetime, step: timedelta) -> None:
    """``n`` rows waiting to be pushed for tenants t0..t9, due (and made) from ``start`` on,
    one every ``step``, in the partition of their instant."""
    conn.execute(
        text(
            "INSERT INTO scheduled_jobs (id, tenant, type, payload, run_at, due_at) "
            "SELECT CAST(lpad(to_hex(CAST(extract(epoch FROM t) * 1000 AS bigint)), 12, '0') "
            "       || '7' || substr(md5(g::text || :start), 1, 19) AS uuid), 't' || (g % 10), "
            "       'x', '{}', t, t "
            "FROM (SELECT g, CAST(:start AS timestamptz) + g * CAST(:step AS interval) AS t "
            "      FROM generate_series(1, :n) g) AS rows"
        ),
        {"n": n, "start": start, "step": step},
    )


WALK = {
    "window": timedelta(minutes=15),
    "horizon": timedelta(seconds=1),
    "limit": 1000,
    "after_tenant": "",
    "after_queue": "",
    "front_lane": 2,
}
SHARES = {
    "tenants": [f"t{i}" for i in range(10)],
    "queues": ["duejobs"] * 10,
    "shares": [100] * 10,
    "caps": [None] * 10,
    "aheads": [timedelta(minutes=15)] * 10,
}


def test_the_claims_count_of_a_tenants_due_rows_reads_its_own_index_on_a_busy_partition(
    parted: App,
) -> None:
    """20,000 rows due now for ten tenants, all in the current partition: the claim's walk
    counts each (tenant, queue) pair's due rows on the pairs' index, reading about the rows it
    counts.
    Seen failing (`python -m bench.partitions` at a million rows, 0.85x the plain schema)
    before the claim's transaction turned bitmap scans off and the count took the index's
    order: on that partition the planner read the due_at index and filtered out the other
    tenants' rows (9,000 a tenant at each batch), or read the tenant's rows by bitmap and
    sorted them."""
    with schema_tx(parted) as conn:
        _rows_at(
            conn, 20_000, store.database_now(conn) - timedelta(minutes=1), timedelta(milliseconds=3)
        )
        conn.execute(text("ANALYZE scheduled_jobs"))
        conn.execute(text(store.QUERIES["claim_plan"].sql))  # as the claim's transaction does
        walk = text("EXPLAIN (ANALYZE) " + store.QUERIES["claim_walk"].sql)
        plan = "\n".join(conn.execute(walk, WALK).scalars())
    removed = [int(n) for n in re.findall(r"Rows Removed by Filter: (\d+)", plan)]
    assert sum(removed) < 100, plan
    assert "Bitmap" not in plan and "claim_queue_idx" in plan, plan


_PARAM = re.compile(r"(?<!:):(\w+)")  # a statement's `:name` (not a `::type` cast)


def _param_names(name: str) -> list[str]:
    """The parameters of the statement ``name``, in the order they first appear."""
    return list(dict.fromkeys(_PARAM.findall(store.QUERIES[name].sql)))


def _generic_plan(conn: Connection, name: str) -> None:
    """Prepare the statement ``name`` as ``generic`` and make its generic plan now, as the
    claim's transaction makes it at the first run on a connection."""
    names = _param_names(name)
    numbered = _PARAM.sub(lambda m: f"${names.index(m[1]) + 1}", store.QUERIES[name].sql)
    conn.exec_driver_sql("PREPARE generic AS " + numbered)
    conn.exec_driver_sql("EXPLAIN EXECUTE generic(" + ", ".join(["NULL"] * len(names)) + ")")


def _run_generic(conn: Connection, name: str, params: dict[str, Any]) -> str:
    """EXPLAIN ANALYZE of the plan :func:`_generic_plan` kept, run with ``params``."""
    types = conn.execute(
        text(
            "SELECT unnest(parameter_types)::text FROM pg_prepared_statements "
            "WHERE name = 'generic'"
        )
    ).scalars()
    driver = conn.connection.driver_connection
    args = ", ".join(
        f"CAST({sql.Literal(params[n]).as_string(driver)} AS {t})"
        for n, t in zip(_param_names(name), types, strict=True)
    )
    explain = f"EXPLAIN (ANALYZE) EXECUTE generic({args})"
    plan = "\n".join(row[0] for row in conn.exec_driver_sql(explain))
    conn.exec_driver_sql("DEALLOCATE generic")
    return plan


@pytest.mark.parametrize(("name", "params"), [("claim_walk", WALK), ("claim_shares", SHARES)])
def test_the_claims_kept_plan_reads_indexes_as_a_partition_planned_empty_fills(
    parted: App, name: str, params: dict[str, Any]
) -> None:
    """The claim runs the plan made at its first run on a connection until PostgreSQL makes
    it again (an ANALYZE), not one made for each batch. Planned while the current partition
    was empty and analyzed, then run after 20,000 rows due in an hour and 1,000 due now came
    in: every partition is still read by its index. Seen failing with sequential scans
    allowed: the walk's test for any due row read the partition's 20,000 later rows."""
    with schema_tx(parted) as conn:
        conn.execute(text("ANALYZE scheduled_jobs"))
        conn.execute(text(store.QUERIES["claim_plan"].sql))
        _generic_plan(conn, name)
        now = store.database_now(conn)
        _rows_at(conn, 20_000, now + timedelta(hours=1), timedelta(milliseconds=1))
        _rows_at(conn, 1_000, now - timedelta(minutes=1), timedelta(milliseconds=1))
        plan = _run_generic(conn, name, params)
    assert "Seq Scan" not in plan and "Bitmap" not in plan, plan
    removed = [int(n) for n in re.findall(r"Rows Removed by Filter: (\d+)", plan)]
    assert sum(removed) < 100, plan
    assert "claim_queue_idx" in plan, plan
    if name == "claim_shares":  # a tenant's urgent rows first, from their own index
        assert "claim_urgent_idx" in plan, plan


def test_the_claim_plans_its_two_statements_once_per_connection(parted: App) -> None:
    """Three claims on one connection: the walk and the share claim are prepared at their
    first run and run their generic plan every time, no plan made per batch (over nine
    partitions, planning the walk took 8 ms against 1.4 ms to run it). Seen failing with
    the statements left to the driver's own preparing (none prepared after three runs) and
    without the claim's plan_cache_mode (custom plans)."""
    schema = parted.engine.get_execution_options()["duejobs_schema"]
    with schema_tx(parted) as conn:
        _rows_at(
            conn, 3_000, store.database_now(conn) - timedelta(minutes=1), timedelta(milliseconds=1)
        )
    with parted.engine.connect() as conn:
        for _ in range(3):
            assert len(claim_due(conn, timedelta(minutes=15), 1000).rows) == 1000
            conn.commit()
        plans = {
            name: conn.execute(
                text(
                    "SELECT generic_plans, custom_plans FROM pg_prepared_statements "
                    "WHERE starts_with(statement, :head)"
                ),
                {"head": in_schema(schema)[name].driver_sql.split("%")[0]},
            ).all()
            for name in ("claim_walk", "claim_shares")
        }
    assert plans == {"claim_walk": [(3, 0)], "claim_shares": [(3, 0)]}


@pytest.mark.slow
def test_every_hot_query_reads_indexes_on_every_partition(parted: App) -> None:
    """Half a million schedules over thirty daily partitions, most finished, a few due: the
    claim, the reconciler's scans, the rescue, the worker's claim and finish and the figures
    read the indexes of each partition, never a partition's rows one by one."""
    start = past_partitions(parted, 30)
    with schema_tx(parted) as conn:
        for days in range(3, 30, 3):
            store.ensure_ahead(conn, DAILY, start + timedelta(days=days))
        conn.execute(
            text(
                "INSERT INTO scheduled_jobs (id, tenant, type, payload, run_at, due_at, status, "
                "finished_at, lease_expires_at, queue_job_id) "
                "SELECT CAST(lpad(to_hex(CAST(extract(epoch FROM t) * 1000 AS bigint)), 12, '0') "
                "       || '7' || substr(md5(g::text), 1, 19) AS uuid), 't' || (g % 50), 'x', "
                "       '{}', t, t, s, CASE WHEN s = 'succeeded' THEN t END, "
                "       CASE WHEN s = 'running' THEN t END, "
                "       CASE WHEN s = 'scheduled' AND g % 2 = 0 THEN 'job' || g END "
                "FROM (SELECT g, CAST(:start AS timestamptz) + g * interval '5 s' AS t, "
                "      CASE WHEN g % 1000 = 0 THEN 'scheduled' WHEN g % 5000 = 1 THEN 'running' "
                "           ELSE 'succeeded' END AS s "
                "      FROM generate_series(1, 500000) g) AS rows"
            ),
            {"start": start},
        )
        conn.execute(text(f"ANALYZE {', '.join(PARTITIONED)}"))

        def explain(name: str, **params: object) -> str:
            statement = text("EXPLAIN " + store.QUERIES[name].sql)
            return "\n".join(conn.execute(statement, params).scalars())

        def explain_claim(name: str, **params: object) -> str:
            """As the claim's transaction plans it (its settings undone after)."""
            with conn.begin_nested() as settings:
                conn.execute(text(store.QUERIES["claim_plan"].sql))
                plan = explain(name, **params)
                settings.rollback()
            return plan

        some = [id_at(start + timedelta(days=d)) for d in (1, 5, 9)]
        plans = {
            "claim": (
                explain_claim(
                    "claim_shares",
                    tenants=["t1"],
                    queues=["duejobs"],
                    shares=[1000],
                    caps=[None],
                    aheads=[timedelta(minutes=15)],
                ),
                "scheduled_jobs_claim_queue_idx",
            ),
            "reconcile": (
                explain(
                    "window_page",
                    window=timedelta(minutes=15),
                    after_due=datetime.min.replace(tzinfo=UTC),
                    after_id=uuid.UUID(int=0),
                    limit=1000,
                ),
                "scheduled_jobs_due_idx",
            ),
            "rescue": (explain("rescue_expired", limit=1000), "scheduled_jobs_lease_idx"),
            "states": (explain("schedule_states", ids=some), "scheduled_jobs_pkey"),
            "worker's claim": (
                explain(
                    "claim_runs",
                    ids=some,
                    tenants=["t1"] * 3,
                    versions=[1] * 3,
                    attempts=[1] * 3,
                    worker="w",
                    lease=timedelta(seconds=20),
                    types=["record"],
                    claim="c",
                    synchronous_commit="off",
                    lock_timeout="2s",
                    hold=timedelta(milliseconds=50),
                ),
                "scheduled_jobs_pkey",
            ),
            "worker's finish": (
                explain(
                    "finish",
                    ids=some,
                    versions=[1] * 3,
                    attempts=[1] * 3,
                    statuses=["succeeded"] * 3,
                    events=["succeeded"] * 3,
                    errors=[None] * 3,
                    retry_ins=[None] * 3,
                    interrupted=[False] * 3,
                    synchronous_commit="off",
                ),
                "scheduled_jobs_pkey",
            ),
            "stats": (
                explain(
                    "live_figures",
                    late=timedelta(minutes=1),
                    tenant=None,
                    limited_queues=[],
                    limited_tenants=[],
                ),
                "scheduled_jobs_due_idx",
            ),
            "prune within a span": (
                explain(
                    "prune_finished_within",
                    age=timedelta(days=1),
                    limit=1000,
                    low=first_id_at(start + timedelta(days=12)),
                    high=first_id_at(start + timedelta(days=15)),
                ),
                "scheduled_jobs_finished_idx",
            ),
            "keyed insert": (
                explain(
                    "insert_schedule",
                    id=id_at(start + timedelta(days=30)),
                    tenant="t1",
                    type="x",
                    key="k",
                    payload="{}",
                    run_at=None,
                    delay=timedelta(minutes=1),
                    jitter_offset=timedelta(0),
                    expires_after=None,
                    max_attempts=None,
                    timezone=None,
                    local_run_at=None,
                    queue="duejobs",
                    priority=0,
                    trace_context=None,
                ),
                "scheduled_jobs_live_key_idx",
            ),
        }
    for name, (plan, index) in plans.items():
        assert full_scans(plan, tables="scheduled_job") == [], (name, plan)
        assert reads_index(plan, index), (name, index, plan)
    outside = partition_name("scheduled_jobs", start + timedelta(days=3))
    span_plan = plans["prune within a span"][0].splitlines()
    span_reads = [line for line in span_plan if "finished" in line]
    assert span_reads and not [line for line in span_reads if outside in line], span_reads
