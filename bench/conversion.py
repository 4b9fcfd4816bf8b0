"""The online conversion to partitioned mode at a real size, while a writer runs.

A scratch schema, plain, filled with CONV_ROWS (200,000) finished schedules made over the
last 30 days, each with its history as a delivered schedule leaves it (two events, an
attempt), and CONV_LIVE (10,000) live ones due in the coming days. A writer thread schedules,
reschedules and cancels throughout, one operation after another, timing each. After
CONV_WARMUP seconds (3) of writing on the plain tables,
``duejobs.services.partition_maintenance.convert`` moves
the schema online (batches of CONV_BATCH, 10,000). Reported: the conversion's time and rows per
second, table by table; the writer's latency before the conversion and during it (p50, p99,
worst) and the operations it made; and that every schedule the writer touched is in the
partitioned tables at its last version and status.

Run at each size in CONV_SIZES (default ``50000,200000``: the rate at two sizes says whether
the time grows in proportion to the rows, which the projection to 10 million assumes):

    python -m bench.conversion
"""

from __future__ import annotations

import os
import statistics
import threading
import time
from datetime import timedelta

from sqlalchemy import text

from bench.common import percentile, scratch_database
from bench.partitions import FILL, HISTORY
from duejobs import App, store
from duejobs.services.partition_maintenance import DEFAULT_AHEAD, convert
from duejobs.store.partitions import Partitioning

SIZES = [int(n) for n in os.environ.get("CONV_SIZES", "50000,200000").split(",")]
LIVE = int(os.environ.get("CONV_LIVE", "10000"))
BATCH = int(os.environ.get("CONV_BATCH", "10000"))
WARMUP = float(os.environ.get("CONV_WARMUP", "3"))
DAYS = 30
MODE = Partitioning(timedelta(days=7), DEFAULT_AHEAD)


class Writer(threading.Thread):
    """Schedules, reschedules and cancels in turn, timing each operation (seconds, with the
    monotonic instant it ended)."""

    def __init__(self, app: App) -> None:
        super().__init__(name="writer", daemon=True)
        self.app = app
        self.timings: list[tuple[float, float]] = []
        self.last: dict[str, str] = {}  # schedule id -> the status its last change left
        self.errors: list[BaseException] = []
        self._halt = threading.Event()

    def run(self) -> None:
        made: list[str] = []
        i = 0
        while not self._halt.is_set():
            i += 1
            started = time.perf_counter()
            try:
                if i % 5 == 0 and made:
                    self.app.reschedule(made[-1], delay=timedelta(hours=2))
                elif i % 7 == 0 and made:
                    sid = made.pop()
                    self.app.cancel(sid)
                    self.last[sid] = "cancelled"
                else:
                    s = self.app.schedule("remind", {"i": i}, delay=timedelta(hours=1))
                    made.append(str(s.id))
                    self.last[str(s.id)] = "scheduled"
            except BaseException as exc:  # reported, not swallowed
                self.errors.append(exc)
                return
            self.timings.append((time.perf_counter() - started, time.monotonic()))

    def stop(self) -> None:
        self._halt.set()
        self.join(60)


def _fill(app: App, schema: str, rows: int) -> None:
    with app.engine.begin() as conn:
        now = store.database_now(conn)
        for status, n, start, span in (
            ("succeeded", rows, now - timedelta(days=DAYS), timedelta(days=DAYS)),
            ("scheduled", LIVE, now + timedelta(hours=1), timedelta(days=3)),
        ):
            conn.execute(
                text(FILL.format(schema=schema)),
                {
                    "salt": status,
                    "status": status,
                    "attempts": 1 if status == "succeeded" else 0,
                    "start": start,
                    "step": span / n,
                    "n": n,
                },
            )
        for statement in HISTORY.format(schema=schema).split(";"):
            conn.execute(text(statement))


def _latencies(timings: list[tuple[float, float]], since: float, until: float) -> str:
    ms = [t * 1000 for t, at in timings if since <= at <= until]
    if not ms:
        return "no operation"
    return (
        f"{len(ms):,} ops, p50 {statistics.median(ms):.1f} ms, p99 {percentile(ms, 0.99):.1f} ms, "
        f"worst {max(ms):.1f} ms"
    )


def one_size(database_url: str, redis_url: str, rows: int) -> None:
    schema = f"conv_{rows}"
    app = App(database_url=database_url, redis_url=redis_url, schema=schema)
    app.migrate()
    try:
        _fill(app, schema, rows)
        writer = Writer(app)
        writer.start()
        time.sleep(WARMUP)
        lines: list[tuple[float, str]] = []
        began = time.monotonic()
        copied = convert(
            app.engine,
            MODE,
            batch_size=BATCH,
            report=lambda line: lines.append((time.monotonic(), line)),
        )
        ended = time.monotonic()
        time.sleep(1)
        writer.stop()
        if writer.errors:
            raise writer.errors[0]
        took = ended - began
        print(f"{rows:,} finished schedules with their history, {LIVE:,} live:")
        print(f"  converted in {took:.1f} s: {copied:,} rows copied, {copied / took:,.0f} rows/s")
        for at, line in lines:
            print(f"    +{at - began:6.1f} s  {line}")
        print(f"  writer before: {_latencies(writer.timings, began - WARMUP, began)}")
        print(f"  writer during: {_latencies(writer.timings, began, ended)}")
        swap_at = next((at for at, line in lines if line.endswith("partitioned mode")), ended)
        print(f"  writer in the last second: {_latencies(writer.timings, swap_at - 1, ended)}")
        with app.engine.connect() as conn:
            assert store.partitioning(conn) is not None
            found = dict(
                conn.execute(
                    text(
                        f"SELECT CAST(id AS text), status FROM {schema}.scheduled_jobs "
                        "WHERE id = ANY(CAST(:ids AS uuid[]))"
                    ),
                    {"ids": list(writer.last)},
                ).all()
            )
        lost = {sid for sid, status in writer.last.items() if found.get(sid) != status}
        print(
            f"  writer's schedules in the partitioned tables as last left: "
            f"{len(writer.last) - len(lost):,} of {len(writer.last):,}"
        )
        assert not lost, f"{len(lost)} of the writer's schedules lost or stale"
    finally:
        with app.engine.begin() as conn:
            conn.execute(text(f"DROP SCHEMA IF EXISTS {schema} CASCADE"))
            conn.execute(text(f"DROP SCHEMA IF EXISTS {schema}_partitioning CASCADE"))
        app.close()


if __name__ == "__main__":
    with scratch_database() as (database_url, redis_url):
        for size in SIZES:
            one_size(database_url, redis_url, size)
