"""The scheduler's claim at 10k, 100k and 1M rows: plan and time stay flat.

Rows: a fixed 2,000 due, spread over DUE_TENANTS (10) tenants; the rest far-future
`scheduled` or finished (half each), spread over TENANTS (200) tenants — the walk over tenants
visits every tenant with rows waiting to be pushed, so their number is held fixed too.
Prints the median time of 10 claims of 1,000 rows per size (both statements: the walk over
tenants and the claim of their shares, rolled back), its ratio to the 10k size, and the
EXPLAIN (ANALYZE, BUFFERS) plans at the largest size. At each size it also times the live
figures of `duejobs stats` (they count every live row: their bound) and one reconciler pass
(bounded by the rows inside the window and the expired leases).

    python -m bench.explain_claim            # SIZES=10000,100000,1000000 by default
"""

from __future__ import annotations

import os
import statistics
import time
from datetime import timedelta

import psycopg
from redis import Redis
from sqlalchemy import Engine, text

from bench.common import TABLES, scratch_database
from duejobs import App, store
from duejobs.config import sqlalchemy_url
from duejobs.core import make_engine
from duejobs.scheduler.claim import FRONT_LANE, claim_due, fair_shares
from duejobs.scheduler.pacing import PACE_AHEAD
from duejobs.services.reconciler import Reconciler

WINDOW = timedelta(minutes=15)
DUE = 2000
DUE_TENANTS = int(os.environ.get("DUE_TENANTS", "10"))
TENANTS = int(os.environ.get("TENANTS", "200"))


def fill(conn: psycopg.Connection, total: int) -> None:
    conn.execute(f"TRUNCATE {TABLES}")
    conn.execute(
        "INSERT INTO scheduled_jobs (id, tenant, type, payload, run_at, due_at, status) "
        "SELECT gen_random_uuid(), 't' || (g %% %s), 'x', '{}', t, t, "
        "CASE WHEN g %% 2 = 0 THEN 'scheduled' ELSE 'succeeded' END "
        "FROM (SELECT g, now() + interval '30 days' + g * interval '1s' AS t "
        "      FROM generate_series(1, %s) g) AS far",
        (TENANTS, total - DUE),
    )
    conn.execute(
        "INSERT INTO scheduled_jobs (id, tenant, type, payload, run_at, due_at) "
        "SELECT gen_random_uuid(), 't' || (g %% %s), 'x', '{}', t, t "
        "FROM (SELECT g, now() - g * interval '1ms' AS t FROM generate_series(1, %s) g) AS d",
        (DUE_TENANTS, DUE),
    )
    conn.commit()
    conn.autocommit = True
    conn.execute("VACUUM ANALYZE scheduled_jobs")
    conn.autocommit = False


def timed(engine: Engine) -> float:
    samples = []
    for _ in range(10):
        with engine.connect() as conn:
            trans = conn.begin()
            start = time.perf_counter()
            claim = claim_due(conn, WINDOW, 1000)
            samples.append(time.perf_counter() - start)
            trans.rollback()
        assert len(claim.rows) == 1000
    return statistics.median(samples)


def plans(engine: Engine) -> list[str]:
    """EXPLAIN ANALYZE of the walk, then of the claim of the shares the walk found."""
    out = []
    with engine.connect() as conn:
        trans = conn.begin()
        walk_params = {
            "window": WINDOW,
            "horizon": PACE_AHEAD,
            "limit": 1000,
            "after_tenant": "",
            "after_queue": "",
            "front_lane": FRONT_LANE,
        }
        walk_sql = text(store.QUERIES["claim_walk"].sql)
        walk = [w for w in conn.execute(walk_sql, walk_params) if w.tenant is not None]
        shares = fair_shares(1000, [w.due for w in walk])
        claim_params = {
            "tenants": [w.tenant for w in walk],
            "queues": [w.queue for w in walk],
            "shares": shares,
            "caps": [None] * len(walk),
            "aheads": [w.ahead for w in walk],
        }
        for name, params in (("claim_walk", walk_params), ("claim_shares", claim_params)):
            explain = text("EXPLAIN (ANALYZE, BUFFERS) " + store.QUERIES[name].sql)
            out += ["", *list(conn.execute(explain, params).scalars())]
        trans.rollback()
    return out


def stats_and_reconcile(url: str, redis_url: str) -> tuple[float, float, float, int]:
    """Seconds for `duejobs stats`' live figures, seconds for one reconciler pass (which
    pushes the window's rows to Redis), seconds for the next one (every job now present: the
    steady state, where each page's presence check reads the queue list), and the live rows
    the figures counted."""
    app = App(database_url=url, redis_url=redis_url)
    Redis.from_url(redis_url).flushdb()
    try:
        with app.engine.connect() as conn:
            start = time.perf_counter()
            live = store.live_figures(conn, timedelta(minutes=1))
            stats_s = time.perf_counter() - start
        start = time.perf_counter()
        Reconciler(app).run_once()
        reconcile_s = time.perf_counter() - start
        start = time.perf_counter()
        Reconciler(app).run_once()
        steady_s = time.perf_counter() - start
    finally:
        app.close()
    overall = next(f for f in live if f.tenant is None and f.type is None)
    return stats_s, reconcile_s, steady_s, overall.scheduled + overall.running


def main() -> None:
    sizes = [int(s) for s in os.environ.get("SIZES", "10000,100000,1000000").split(",")]
    with scratch_database() as (url, redis_url), psycopg.connect(url) as conn:
        engine = make_engine(sqlalchemy_url(url))
        base = None
        shown: list[str] = []
        for size in sizes:
            fill(conn, size)
            seconds = timed(engine)
            shown = plans(engine)  # before the reconciler pushes the due rows
            base = base or seconds
            print(
                f"claim of 1000 at {size:>10,} rows: {seconds * 1000:6.2f} ms  "
                f"ratio to {sizes[0]:,}: {seconds / base:.2f}x",
                flush=True,
            )
            stats_s, reconcile_s, steady_s, live = stats_and_reconcile(url, redis_url)
            print(
                f"    stats live figures: {stats_s * 1000:8.1f} ms over {live:,} live rows; "
                f"one reconcile pass: {reconcile_s * 1000:7.1f} ms "
                f"(the next, every job present: {steady_s * 1000:7.1f} ms)",
                flush=True,
            )
        print(f"\nplans at {sizes[-1]:,} rows (the walk, then the claim):")
        for line in shown:
            print("  " + line)
        engine.dispose()


if __name__ == "__main__":
    main()
