"""Testing your handlers: run what is due, in your test's process, through the real claim,
revalidation and effect fence, and move the schedules' clock forward — so "the reminder
fires after 30 minutes" is a test of milliseconds.

::

    from duejobs.testing import advance, run_due

    def test_the_reminder_fires_after_30_minutes(duejobs_app):
        made = send_reminder.schedule({"user": 7}, delay=timedelta(minutes=30))
        assert run_due(duejobs_app) == 0          # not yet due
        advance(duejobs_app, minutes=30)
        assert run_due(duejobs_app) == 1
        assert duejobs_app.get(made.id).status is Status.SUCCEEDED

The pytest plugin (:mod:`duejobs.testing.plugin`, loaded by pytest when duejobs is installed)
gives the servers, a database of the session's own and the ``duejobs_app`` fixture.

Promises: :func:`run_due` runs exactly what a scheduler, a worker and their checks would run
now — a cancelled or superseded schedule is skipped, a not-yet-due one waits, an effect made
through ``ctx.transaction()`` happens once, a failure is retried by its type's policy (after
its backoff: :func:`drain` moves the clock to it). :func:`advance` moves the *schedules*, not
PostgreSQL's clock: every live schedule's due and intended times and running attempts' leases
move earlier by the amount, which is what the clock moving forward is to duejobs; the history
keeps its real times, and recurring definitions keep following the real clock.

Not for production: :func:`advance` rewrites every live schedule of the database it is given.
"""

from __future__ import annotations

from datetime import timedelta

from duejobs import store
from duejobs.core import HasCore
from duejobs.scheduler.loop import Scheduler, SchedulerConfig
from duejobs.worker import Runtime, Worker, WorkerConfig

__all__ = ["advance", "drain", "run_due"]

# A run_due that is still finding due work after this many rounds is a loop of schedules
# that keep making each other due now: an error, not a hang.
MAX_ROUNDS = 1000


def run_due(app: HasCore) -> int:
    """Run every schedule due now by the database clock, and those they make due now, until
    none is; how many attempts ran. The scheduler's claim (a window of zero: only what is
    due), RQ on the App's Redis and a worker in this process, as in production."""
    core = app.core
    scheduler = Scheduler(core, SchedulerConfig(window=timedelta(0)))
    runtime = Runtime(core, WorkerConfig(concurrency=1))
    queues = sorted({core.queue, *(h.queue for h in core.handlers.values() if h.queue)})
    ran = 0
    try:
        for _ in range(MAX_ROUNDS):
            scheduler.recurring.run_once()
            claimed = scheduler.run_once().claimed
            if claimed == 0:
                return ran
            Worker(runtime, queues).work(burst=True)
            ran += claimed
    finally:
        runtime.close()
    raise RuntimeError(f"schedules still due after {MAX_ROUNDS} rounds of run_due: a loop?")


def advance(
    app: HasCore,
    by: timedelta | None = None,
    *,
    days: float = 0,
    hours: float = 0,
    minutes: float = 0,
    seconds: float = 0,
) -> None:
    """Move the schedules' clock forward: ``advance(app, minutes=30)`` or
    ``advance(app, timedelta(minutes=30))``. Runs nothing: :func:`run_due` after."""
    step = (by or timedelta(0)) + timedelta(
        days=days, hours=hours, minutes=minutes, seconds=seconds
    )
    if step < timedelta(0):
        raise ValueError(f"advance moves the clock forward only, got {step}")
    with app.core.transaction() as conn:
        store.advance_live(conn, step)


def drain(app: HasCore, within: timedelta = timedelta(days=1)) -> int:
    """Run everything due in the next ``within`` (a day by default): what is due now, then
    the clock moved to the next due schedule, again, until none is due within it — retries
    after their backoff and schedules made by handlers included; how many attempts ran."""
    ran, left = run_due(app), within
    for _ in range(MAX_ROUNDS):
        with app.core.transaction() as conn:
            wait = store.next_due_in(conn)
        if wait is None or wait > left:
            return ran
        if wait <= timedelta(0):  # due, yet run_due ran it not: no worker here serves it
            raise RuntimeError(
                "a schedule is due that run_due cannot run: its queue is not one of the App's "
                "or its handlers', or its type has no handler in this App"
            )
        step = wait
        advance(app, step)
        left -= step
        ran += run_due(app)
    raise RuntimeError(f"schedules still coming due after {MAX_ROUNDS} steps of drain: a loop?")
