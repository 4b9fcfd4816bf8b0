"""What the tracing instrumentation costs a delivery when tracing is off, in one run.

TRACE_JOBS (1,000) no-op deliveries, each claimed, run and closed through PostgreSQL by a
worker Runtime in this process (`Runtime.handle`, no Redis round trip: the part tracing
touches), timed per delivery:

* baseline — `duejobs.observability.tracing`'s span helpers replaced by `contextlib.nullcontext`:
the
  worker as if it had no instrumentation;
* duejobs — the helpers as shipped, OpenTelemetry installed but no SDK configured (the check
  each one makes before it does nothing);
* informative — with the SDK configured (an in-memory exporter): what tracing on costs.

TRACE_ROUNDS (5) rounds alternated, medians. Target: off within 3% of the baseline.

    python -m bench.tracing_cost
"""

from __future__ import annotations

import contextlib
import os
import statistics
import time
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any

import psycopg

from bench.common import TABLES, scratch_database
from duejobs import App, ScheduleRequest
from duejobs.observability import tracing
from duejobs.worker import Runtime, WorkerConfig

JOBS = int(os.environ.get("TRACE_JOBS", "1000"))
ROUNDS = int(os.environ.get("TRACE_ROUNDS", "5"))


@contextlib.contextmanager
def _nothing(*args: Any, **kwargs: Any) -> Iterator[None]:
    yield None


@contextlib.contextmanager
def _instrumentation(removed: bool) -> Iterator[None]:
    saved = (tracing.span, tracing.attempt)
    if removed:
        tracing.span, tracing.attempt = _nothing, _nothing  # type: ignore[assignment]
    try:
        yield
    finally:
        tracing.span, tracing.attempt = saved


def _round(app: App, url: str, runtime: Runtime) -> float:
    """Seconds per delivery over JOBS due deliveries."""
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f"TRUNCATE {TABLES}")  # type: ignore[arg-type]
    ids = app.schedule_many([ScheduleRequest("noop", {}, delay=0) for _ in range(JOBS)])
    started = time.perf_counter()
    for schedule_id in ids:
        runtime.handle(schedule_id, 1, 1, "default")
    return (time.perf_counter() - started) / JOBS


def _configured() -> Callable[[], None]:
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(InMemorySpanExporter()))
    trace.set_tracer_provider(provider)
    return provider.shutdown


def main() -> None:
    with scratch_database() as (url, redis_url):
        app = App(url, redis_url)
        app.handler("noop")(lambda ctx, payload: None)
        runtime = Runtime(app, WorkerConfig(heartbeat=timedelta(seconds=5)))
        base: list[float] = []
        off: list[float] = []
        for _ in range(ROUNDS):
            with _instrumentation(removed=True):
                base.append(_round(app, url, runtime))
            off.append(_round(app, url, runtime))
        stop = _configured()
        on = [_round(app, url, runtime) for _ in range(ROUNDS)]
        stop()
        runtime.close()
        app.close()
    b, o, n = (statistics.median(v) * 1e6 for v in (base, off, on))
    verdict = "ok  " if o <= b * 1.03 else "MISS"
    print(f"{verdict} tracing off: {o:.0f} µs per delivery, baseline {b:.0f} µs, ratio {o / b:.3f}")
    print(f"     tracing on (in-memory exporter): {n:.0f} µs per delivery, ratio {n / b:.3f}")


if __name__ == "__main__":
    main()
