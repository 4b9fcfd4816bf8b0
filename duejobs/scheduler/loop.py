"""The windowed scheduler: moves rows that are due soon from PostgreSQL into RQ.

Each pass (:meth:`Scheduler.run_once`):

1. claims ``scheduled`` rows due within the window that have no queue job for their current
   version, ``FOR UPDATE SKIP LOCKED``, in batches, recording their deterministic
   ``queue_job_id`` and an ``enqueued`` event. Each batch is shared fairly among the tenants
   that have due rows (equal shares, a tenant needing less leaves the rest to the others,
   oldest ``due_at`` first within a tenant, each tenant's share among its queues; the walk
   over (tenant, queue) pairs resumes where the last batch stopped), and is pushed in turns
   (every tenant's first row, then every second), so a tenant with 20,000 rows due does not
   delay one with 20; the first row of a tenant with fewer than two jobs waiting in the queue
   goes to the front of it; rows under a rate limit only as its pace has starts for them
   within a second, each due at a slot of its own (:mod:`duejobs.scheduler.claim`,
   :mod:`duejobs.scheduler.pacing`);
2. pushes each batch to Redis in one round trip (due rows onto the queue, later ones into
   RQ's scheduled registry);
3. commits only after Redis acknowledged the push — if the push fails the transaction rolls
   back, so a row is never marked pushed without a real queue job;
4. keeps taking batches while they come back full, then promotes the jobs whose time has come,
   by the database clock, from the scheduled registry onto the queue.

The occurrences of recurring schedules become rows on a loop of their own, which
:meth:`Scheduler.run` starts beside the claims (:mod:`duejobs.scheduler.occurrences`): a
pass claims them as it claims any row.

:meth:`Scheduler.run` repeats passes every ``poll_interval`` (sub-second, so a job due in 2 s
does not wait for the next window), or sooner: the promotion says when the earliest job left
in a scheduled registry falls due (in the same script, no extra round trip), and the next pass
starts then, by the database clock as the last claim read it — so a deferred job reaches its
queue within milliseconds of its time, not up to a poll later. Such a pass only promotes (the
database clock read in one statement): the claims keep the poll's pace, so a steady flow of
deferred jobs does not turn the claims into a busy loop, and an idle scheduler makes no more
passes than the poll's. A row written due within a second (``schedule(delay=0)``, a
``run_now``) wakes it through Redis (:mod:`duejobs.delivery.wakes`): a pass of claims starts
at once, at most one every 10 ms, on the loop's own thread (one claim loop: a wake brings a
row or a few); a wake lost costs that row a poll at most.

Claims commit without waiting for the WAL flush (``synchronous_commit = off`` for the claim's
transaction only), so a worker that pops a job before the claim commits waits less on the
row's lock. A claim lost in a PostgreSQL crash leaves its rows unmarked; they are claimed
again and the push finds the job if it still waits. If a worker ran it meanwhile, that run's
bookkeeping was lost with it (WAL is sequential) and the schedule runs again — the same case
as the workers' own bookkeeping commits (see the worker); ``ctx.transaction`` effects, lost
with the same crash, stay exactly-once.

What it promises: any number of schedulers may run at once — row locks with SKIP LOCKED and
the atomic push mean no (schedule, version, attempt) is pushed twice. If the process dies
between the push and the commit, the rows stay unmarked and are claimed again; the push then
finds the live job and does not create a second one. PostgreSQL or Redis down: the pass
fails, the loop logs it and backs off (up to ``max_backoff``) and keeps going — so does any
other error a pass raises (logged with its traceback, counted in
``duejobs_scheduler_failed_passes_total``): one tenant's data can fail a pass, never stop the
loop, and a recurring definition that cannot be evaluated is quarantined on its own
(:mod:`duejobs.scheduler.occurrences`). SIGTERM/SIGINT (via :meth:`Scheduler.stop`): no new claim
starts, the batch in flight finishes.

Tenants with an in-flight quota (``App.set_quota(max_inflight=)``) have only their *due* rows
pushed, and only while their pushed-or-running jobs are under the cap; the rest stay in the
table. Two claims never fill the same tenant's last places (a per-tenant lock held to the
claim's commit). Without such a quota a tenant's pushed backlog waits in the one RQ queue,
first in first out: set a default in-flight quota (tenant ``"*"``) to keep a burst from
delaying everyone else.

What it does not promise: the start time. A job starts when a worker is free; see ``bench/``
for measured lag. It never starts early: the worker checks the database clock.

Knobs (:class:`SchedulerConfig`): ``window`` (15 min), ``batch_size`` (100),
``poll_interval`` (0.1 s; ``throttled_poll_interval``, 25 ms, while a tenant's due rows wait
only for in-flight room, so its slots refill promptly), ``max_backoff`` (5 s),
``concurrency`` (2 claim loops per pass, each on its own connection — while one waits for
Redis the other works PostgreSQL; safe for the same reason several schedulers are); the queue
is the App's.
"""

from __future__ import annotations

import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING

from duejobs import store
from duejobs.core import HasCore
from duejobs.delivery import Push, PushResult
from duejobs.delivery.wakes import WakeWatch, wake_key
from duejobs.observability import metrics, tracing
from duejobs.scheduler import occurrences
from duejobs.scheduler.claim import FIRST, Claim, claim_due
from duejobs.services.loop import Loop, backoff
from duejobs.validation import check_count, check_duration

if TYPE_CHECKING:
    from duejobs.delivery import Deliverer

log = logging.getLogger("duejobs.scheduler")

# Seconds a stop waits for the recurring loop's pass under way.
RECURRING_STOP_WAIT = 30
# The least pause before a pass that promotes a deferred job: a pass that woke a hair before
# its time (by the database's clock) tries again this much later, never in a busy loop.
NEXT_DUE_MARGIN = 0.001


@dataclass(frozen=True)
class SchedulerConfig:
    """Scheduler knobs."""

    window: timedelta = timedelta(minutes=15)
    batch_size: int = 100
    poll_interval: timedelta = timedelta(milliseconds=100)
    throttled_poll_interval: timedelta = timedelta(milliseconds=25)
    max_backoff: timedelta = timedelta(seconds=5)
    concurrency: int = 2

    def __post_init__(self) -> None:
        check_count("batch_size", self.batch_size, 1, 10_000)
        check_count("concurrency", self.concurrency, 1, 16)
        check_duration("window", self.window, zero_ok=True)
        for name in ("poll_interval", "throttled_poll_interval", "max_backoff"):
            check_duration(name, getattr(self, name))


@dataclass(frozen=True)
class PassResult:
    """What one pass did."""

    claimed: int = 0
    queued: int = 0
    deferred: int = 0
    already_present: int = 0
    promoted: int = 0
    batches: int = 0
    # Tenants whose due rows waited for room under their in-flight quota.
    throttled: frozenset[str] = frozenset()
    # When the earliest job left in a scheduled registry falls due (database clock, seconds
    # since the epoch), None when none is left.
    next_due: float | None = None


class Scheduler:
    """Claims due rows and pushes them to RQ; see the module docstring for its promises."""

    def __init__(self, app: HasCore, config: SchedulerConfig | None = None) -> None:
        self.core = app.core
        self.config = config or SchedulerConfig()
        self._loop = Loop("scheduler", log, metrics.FAILED_PASSES)
        # Where the next claim's walk over (tenant, queue) pairs starts (shared by the loops).
        self._cursor = FIRST
        # The database clock minus this one, from the last claim; when the last pass started.
        self._clock_offset = 0.0
        self._pass_started = time.monotonic()
        # When the last pass with claims started; whether the next pass was brought forward
        # for a deferred job's time (it then only promotes, until a poll interval has passed).
        self._last_claims = 0.0
        self._woken_early = False
        # An App wrote a row due before the next poll (duejobs.delivery.wakes): claim now.
        self._claims_wanted = False
        self._claims_every = self.config.poll_interval.total_seconds()
        self._pool = ThreadPoolExecutor(self.config.concurrency, "duejobs-claim")
        self.recurring = occurrences.Materializer(
            self.core, self.config.window, self.config.poll_interval, self.config.max_backoff
        )
        # Each claim loop and the recurring loop hold a connection at once.
        self.core.ensure_pool(self.config.concurrency + 1)

    @property
    def deliverer(self) -> Deliverer:
        """The App's delivery side, made on its first pass: a cluster's client reads the
        cluster's map when it is made, so a scheduler started while its cluster is away
        fails its passes (retried) instead of ending."""
        return self.core.deliverer()

    def stop(self) -> None:
        """Ask the loops to stop after the batch in flight."""
        self._loop.stop()
        self.recurring.stop()

    def close(self) -> None:
        """Release the claim threads (the loop must have stopped)."""
        self._pool.shutdown(wait=True)

    @property
    def stopping(self) -> bool:
        return self._loop.stopping

    def _batch(self) -> tuple[Claim, PushResult]:
        with self.core.engine.begin() as conn:
            sent = time.time()
            claim = claim_due(conn, self.config.window, self.config.batch_size, after=self._cursor)
            # The database clock ahead of this one by at most this (the statement's time
            # was taken after it was sent): what turns a due time into a local wait.
            self._clock_offset = claim.db_now.timestamp() - sent
            self._cursor = claim.cursor
            rows = claim.rows
            pushes = [Push(r, front=r.front, unpushed=True, at=r.group_at) for r in rows]
            result = self.deliverer.push(pushes, claim.db_now)  # raises → rollback
            # Last: the limits' rows, which the workers' grants lock. One held past its wait
            # keeps its pointer: the next claim gives those starts again, the grant keeps the
            # limit and turns the extra ones back.
            if claim.paces and not store.advance_paces(conn, claim.paces):
                log.warning("a rate limit's row stayed locked: its pace was not moved on")
        return claim, result

    def _drain(self) -> tuple[PassResult, datetime]:
        """Batches on one connection until one comes back short (or a stop is asked)."""
        claimed = queued = deferred = present = batches = 0
        throttled: set[str] = set()
        while True:
            claim, result = self._batch()
            batches += 1
            claimed += len(claim.rows)
            queued += result.queued
            deferred += result.deferred
            present += result.present
            throttled.update(claim.throttled)
            if len(claim.rows) < self.config.batch_size or self.stopping:
                drained = PassResult(
                    claimed, queued, deferred, present, 0, batches, frozenset(throttled)
                )
                return drained, claim.db_now

    def run_once(self) -> PassResult:
        """One pass: ``concurrency`` claim loops drain what is due, then promotion — or, for a
        pass started before the poll for a deferred job's time, that promotion alone."""
        self._pass_started = time.monotonic()
        since_claims = self._pass_started - self._last_claims
        wanted = self._claims_wanted
        if wanted:  # cleared before the claims: a row woken for after this runs them again
            self._claims_wanted = False
        promotion_only = self._woken_early and not wanted and since_claims < self._claims_every
        self._woken_early = False
        with metrics.PASS_SECONDS.time(), tracing.span("duejobs.scheduler.pass") as span:
            result = self._promotion_pass() if promotion_only else self._pass(woken=wanted)
            if span is not None:
                span.set_attributes(
                    tracing.attributes(
                        claimed=result.claimed, queued=result.queued, deferred=result.deferred
                    )
                )
        metrics.PUSHED.labels("queue").inc(result.queued)
        metrics.PUSHED.labels("scheduled").inc(result.deferred)
        metrics.PUSHED.labels("already_present").inc(result.already_present)
        metrics.PROMOTED.inc(result.promoted)
        for tenant in result.throttled:
            metrics.THROTTLED.labels(metrics.tenant_label(tenant)).inc()
        return result

    def _pass(self, woken: bool = False) -> PassResult:
        """Claims, then promotion. A pass woken for a row due now claims on this thread
        alone: one row or a few, which a second loop would only slow (its empty walk beside
        the claim, the handoff to the claim threads); a batch that comes back full starts the
        next pass at once, with every loop."""
        self._last_claims = self._pass_started
        if self.config.concurrency == 1 or woken:
            drained = [self._drain()]
        else:
            futures = [self._pool.submit(self._drain) for _ in range(self.config.concurrency)]
            drained = [f.result() for f in futures]
        claimed, queued, deferred, present, batches = (
            sum(getattr(r, name) for r, _ in drained)
            for name in ("claimed", "queued", "deferred", "already_present", "batches")
        )
        throttled = frozenset().union(*(r.throttled for r, _ in drained))
        now = max(now for _, now in drained)
        promoted, next_due = self._promote(now)
        return PassResult(
            claimed, queued, deferred, present, promoted, batches, throttled, next_due
        )

    def _promotion_pass(self) -> PassResult:
        """The promotion alone, by the database clock read in one statement: what a pass
        started for a deferred job's time needs, without the claims' statements (under a
        steady flow of deferred jobs those passes come every few milliseconds)."""
        with self.core.statement() as conn:
            now = store.database_now(conn)
        promoted, next_due = self._promote(now)
        return PassResult(promoted=promoted, next_due=next_due)

    def _promote(self, now: datetime) -> tuple[int, float | None]:
        """Jobs due by ``now`` onto their queues; how many, and when the next one falls due."""
        promoted = 0
        while True:  # a peak can make thousands due at one instant
            promotion = self.deliverer.promote(now, limit=self.config.batch_size * 10)
            promoted += promotion.moved
            if promotion.moved < self.config.batch_size * 10 or self.stopping:
                return promoted, promotion.next_due

    def _woken(self) -> None:
        """A row due before the next poll was written: the next pass claims, and starts now."""
        self._claims_wanted = True
        self._loop.nudge()

    def backoff(self, failures: int) -> float:
        """Seconds to wait after ``failures`` failed passes in a row: doubling from the poll
        interval, capped at ``max_backoff`` (however long the outage lasts)."""
        return backoff(self.config.poll_interval, self.config.max_backoff, failures)

    def _pause(self, result: PassResult) -> timedelta:
        """None while batches come back full; else the poll interval (shorter while a
        tenant waits for in-flight room, so its slots refill promptly), or, when a deferred
        job falls due sooner, until its time: the next pass promotes it then, not up to a
        poll interval later. Counted from the pass's start, as the loop counts it."""
        if result.claimed >= self.config.batch_size:
            return timedelta(0)
        poll = (
            self.config.throttled_poll_interval if result.throttled else self.config.poll_interval
        )
        if result.next_due is None:
            return poll
        # Its time by this clock: the offset errs ahead, so the database finds it due or
        # all but (the pass's claim statement comes first and takes longer than the error).
        left = result.next_due - (time.time() + self._clock_offset)
        if not left < poll.total_seconds():  # later than the poll (or a score of +inf)
            return poll
        self._woken_early = True  # the next pass promotes, the claims wait for the poll
        self._claims_every = poll.total_seconds()
        until = time.monotonic() - self._pass_started + max(left, NEXT_DUE_MARGIN)
        return min(poll, timedelta(seconds=until))

    def run(self) -> None:
        """Pass after pass until :meth:`stop` (see :mod:`duejobs.services.loop`), the
        recurring definitions' loop beside it in a thread."""
        recurring = threading.Thread(
            target=self.recurring.run, name="duejobs-recurring", daemon=True
        )
        recurring.start()
        WakeWatch(
            lambda: self.deliverer.redis,
            wake_key(self.core.queue),
            self._woken,
            lambda: self.stopping,
            self.backoff,
        ).start()
        try:
            self._loop.run_forever(
                self.run_once,
                self._pause,
                self.config.poll_interval,
                self.config.max_backoff,
                report=_log_pass,
            )
        finally:
            self.recurring.stop()
            recurring.join(RECURRING_STOP_WAIT)
            if recurring.is_alive():  # a pass held up past its locks' bounds: not waited for
                log.warning("the recurring loop did not stop within %d s", RECURRING_STOP_WAIT)
        log.info("scheduler stopped")


def _log_pass(result: PassResult) -> None:
    if result.claimed or result.promoted:
        log.debug("scheduler pass: %s", result)
