"""Rate limits as their tests drive them: a scheduler and a worker running in threads, and
the attempts' starts read back by the database clock."""

from __future__ import annotations

import bisect
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime, timedelta

from sqlalchemy import text

from duejobs import App
from duejobs.scheduler.loop import Scheduler, SchedulerConfig
from duejobs.worker import Runtime, Worker, WorkerConfig
from tests.support.slots import count_rows
from tests.support.system import System


@contextmanager
def running(
    system: System,
    *slots: int,
    schedulers: int = 1,
    claim_lock_timeout: timedelta = timedelta(seconds=2),
) -> Iterator[None]:
    """``schedulers`` schedulers and a worker of each of ``slots`` slots, each in a thread of
    its own, stopped (and waited for, within 30 s) at the end."""
    config = SchedulerConfig(poll_interval=timedelta(milliseconds=50))
    services = [system.scheduler, *(Scheduler(system.app, config) for _ in range(schedulers - 1))]
    runtimes = [
        Runtime(
            system.app,
            WorkerConfig(
                heartbeat=timedelta(milliseconds=200),
                concurrency=n,
                claim_lock_timeout=claim_lock_timeout,
            ),
        )
        for n in slots
    ]
    workers = [Worker(runtime) for runtime in runtimes]
    threads = [
        threading.Thread(target=target, daemon=True)
        for target in [*(s.run for s in services), *(w.work for w in workers)]
    ]
    for thread in threads:
        thread.start()
    try:
        yield
    finally:
        for service in services:
            service.stop()
        for worker in workers:
            worker.stop()
        for thread in threads:
            thread.join(30)
        for runtime in runtimes:
            runtime.close()
        for service in services:
            service.close()
    assert not any(thread.is_alive() for thread in threads)


def starts(app: App, tenant: str | None = None) -> list[datetime]:
    """When each attempt started (of ``tenant``'s schedules, or all), in order: the database
    clock of the statement that claimed it, the clock rate limits count by."""
    with app.engine.connect() as conn:
        rows = conn.execute(
            text(
                "SELECT started_at FROM scheduled_job_attempts "
                "WHERE CAST(:tenant AS text) IS NULL OR tenant = :tenant ORDER BY started_at"
            ),
            {"tenant": tenant},
        )
        return [r.started_at for r in rows]


def most_in_a_window(times: list[datetime], period: timedelta) -> int:
    """The most starts in any window ``[t, t + period)``: one opens at each start."""
    return max((bisect.bisect_left(times, t + period) - i for i, t in enumerate(times)), default=0)


def succeeded(app: App) -> int:
    return count_rows(app, "SELECT count(*) FROM scheduled_jobs WHERE status = 'succeeded'")
