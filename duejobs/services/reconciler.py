"""The reconciler: finds every drift between the table and the queue, and heals it.

The queue is a delivery mechanism, not the authority; each pass (:meth:`Reconciler.run_once`)
makes Redis agree with PostgreSQL again:

1. **Schedules without a job.** Every ``scheduled`` row inside the window is checked against
   Redis and, if Redis cannot hand its job to a worker any more (Redis lost it — a restart, a
   ``FLUSHALL``, an eviction —, a push failed, a worker popped it and died before claiming
   the row, an operator trimmed a list; see :mod:`duejobs.delivery`), pushed again under its
   deterministic id. A job still on its queue or in its registry is left alone, so this
   never creates a second one. The last line of defence needs no Redis knowledge: a row
   overdue by more than ``stuck_after`` (15 s) is pushed again unless its id is on its queue
   or in its registry, whatever its job hash says — counted in
   ``duejobs_overdue_repushed_total``. Rows the scheduler has not pushed yet are pushed too,
   so deliveries go on even with no scheduler running.
2. **Work whose worker died.** ``running`` rows whose lease expired (the worker stopped
   renewing it: SIGKILL, a lost host) get their attempt recorded as ``abandoned`` and go back
   to ``scheduled`` — due at once — or to ``failed`` once attempts are exhausted. With the
   default lease (20 s, renewed every 5 s) and ``--every 5`` that happens within 25 s of
   the death. A handler that is merely slow keeps renewing its lease and is never rescued.
3. **Jobs without a schedule.** Waiting queue jobs whose schedule is missing, finished,
   cancelled, or at another version are removed from Redis: among the first
   ``ORPHAN_SCAN_MOST`` (10,000) of each queue and scheduled registry, so a pass costs the
   same behind a backlog of millions.
4. **What RQ's own worker would clean.** Finished and failed registry entries past their
   expiry (``result_ttl``: their hashes are gone) leave the registries, a dead worker's started
   entries leave the started registries (their hashes failed, to expire), and dead workers
   leave ``rq:workers`` and the per-queue worker sets — RQ's ``clean_registries``, which
   duejobs' worker, with a loop of its own, does not run. It costs what expired, not what is
   there, so it runs every pass: a registry holds at most a pass's worth past its expiry.
   Counted in ``duejobs_redis_cleaned_total``.

Rows past their lease that another transaction holds locked are not rescued (the rescue never
waits for a lock): they are counted in ``duejobs_locked_past_lease`` and said at warning each
pass, since no rescue can come before that transaction ends — the worker's fence bounds its
own on the server (``fence_idle_timeout``), docs/deployment.md says which server settings
bound the others.

Then jobs whose time has come are promoted, as the scheduler does. (In partitioned mode, the
partitions of the coming periods are made by a service of their own, which ``duejobs
reconcile`` runs beside this one: :mod:`duejobs.services.partition_maintenance`.)

Safe while schedulers, workers and other reconcilers run: rows are locked with SKIP LOCKED,
pushes are atomic and idempotent, and a job is only removed when the database says for certain
that nobody will run it. A crash mid-pass leaves nothing worse: each batch commits on its own.

Cost of a pass: the ``scheduled`` rows inside the window (plus expired leases and the first
waiting queue jobs), read in pages of ``batch_size`` — never the history of finished rows.

A pass that fails — an outage, or any other error — is logged and the loop goes on. A pass
that fixed something logs one line at info, saying what; the passes that fixed nothing are
summed into one line every ``QUIET_SUMMARY_EVERY`` (10 min) — a reconciler every 5 s logs a few
hundred lines a day, not a line per pass.

Knobs (:class:`ReconcileConfig`, checked when built): ``window`` (15 min, as the scheduler),
``batch_size`` (1000), ``stuck_after`` (15 s).
"""

from __future__ import annotations

import contextlib
import logging
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING

from duejobs import store
from duejobs.core import HasCore
from duejobs.delivery import Push, registries
from duejobs.models import Status
from duejobs.observability import metrics
from duejobs.rq_wire.job_ids import parse_job_id
from duejobs.rq_wire.scripts import STUCK_AFTER
from duejobs.services.loop import Loop
from duejobs.timespec import spell_duration
from duejobs.validation import check_count, check_duration

if TYPE_CHECKING:
    from sqlalchemy import Connection

    from duejobs.delivery import Deliverer

log = logging.getLogger("duejobs.reconcile")
# How often the passes that fixed nothing are summed into one log line.
QUIET_SUMMARY_EVERY = timedelta(minutes=10)


# The waiting jobs of each queue and scheduled registry, from the head, that the search for
# jobs without a schedule reads in a pass or a figure (see orphan_jobs).
ORPHAN_SCAN_MOST = 10_000


@dataclass(frozen=True)
class ReconcileConfig:
    """Reconciler knobs."""

    window: timedelta = timedelta(minutes=15)
    batch_size: int = 1000
    stuck_after: timedelta = STUCK_AFTER

    def __post_init__(self) -> None:
        check_duration("window", self.window, zero_ok=True)
        check_count("batch_size", self.batch_size, 1, 100_000)
        check_duration("stuck_after", self.stuck_after)


@dataclass(frozen=True)
class ReconcileResult:
    """What one pass fixed, by kind."""

    checked: int = 0
    repushed: int = 0
    # Of those, rows overdue past ``stuck_after`` whose job hash claimed to be alive.
    overdue_repushed: int = 0
    rescued: int = 0
    failed: int = 0
    orphans_removed: int = 0
    promoted: int = 0
    # RQ's structures cleaned (see the module docstring's fourth step).
    expired_removed: int = 0
    abandoned_removed: int = 0
    dead_workers_removed: int = 0
    # Running rows past their lease another transaction held locked (not rescued).
    locked_past_lease: int = 0

    @property
    def fixed(self) -> int:
        return self.repushed + self.rescued + self.failed + self.orphans_removed


def orphan_jobs(
    app: HasCore,
    chunk: int = 1000,
    *,
    reading: Connection | None = None,
    most: int | None = ORPHAN_SCAN_MOST,
) -> Iterator[str]:
    """Waiting queue jobs of duejobs whose schedule is gone, finished, or at another version.

    Only what the database says for certain: a row that is ``scheduled`` at the job's version
    may be in the middle of a push by a scheduler, so its job is never called an orphan.
    The scan follows the queue while workers take from it: a job it misses is found next time.
    It reads the first ``most`` jobs of each queue and of each scheduled registry (those
    next to run; None: all of them): its cost stays flat however deep a backlog grows, and
    an orphan further back is found as the queue moves up (a worker that takes one first
    skips it, reading its row). The rows are read on the primary, or on ``reading`` (a
    figure's count, from the replica: removal always asks the primary).
    """
    core = app.core
    for ids in core.deliverer().waiting_job_ids(chunk, most):
        ours = {job: parsed for job in ids if (parsed := parse_job_id(job)) is not None}
        with contextlib.nullcontext(reading) if reading else core.engine.connect() as conn:
            states = store.schedule_states(conn, [p[0] for p in ours.values()])
        for job, (schedule_id, version, _attempt) in ours.items():
            state = states.get(schedule_id)
            if state is None or not state[0].is_live or state[1] != version:
                yield job


class Reconciler:
    """One reconciliation pass at a time; see the module docstring for its promises."""

    def __init__(self, app: HasCore, config: ReconcileConfig | None = None) -> None:
        self.core = app.core
        self.config = config or ReconcileConfig()
        self._loop = Loop("reconcile", log, metrics.RECONCILE_FAILED_PASSES)
        self._quiet = _QuietPasses(QUIET_SUMMARY_EVERY)

    @property
    def deliverer(self) -> Deliverer:
        """The App's delivery side, made on its first pass: a cluster's client reads the
        cluster's map when it is made, so a reconciler started while its cluster is away
        fails its passes (retried) instead of ending."""
        return self.core.deliverer()

    def stop(self) -> None:
        """Ask the loop to stop after the pass under way."""
        self._loop.stop()

    def run_once(self) -> ReconcileResult:
        """Rescue, re-push, remove orphans, promote; returns the counts."""
        with self.core.engine.begin() as conn:
            rescue = store.rescue_expired(conn, self.config.batch_size)
        rescued = rescue.by_status
        self._report_locked(rescue.locked)
        checked, repushed, stuck, now = self._repush_window()
        removed = self._remove_orphans()
        promoted = self.deliverer.promote(now).moved
        cleaned = registries.clean(self.deliverer, self.config.batch_size)
        result = ReconcileResult(
            checked=checked,
            repushed=repushed,
            overdue_repushed=stuck,
            rescued=rescued.get(Status.SCHEDULED.value, 0),
            failed=rescued.get(Status.FAILED.value, 0),
            orphans_removed=removed,
            promoted=promoted,
            expired_removed=cleaned.expired,
            abandoned_removed=cleaned.abandoned,
            dead_workers_removed=cleaned.dead_workers,
            locked_past_lease=rescue.locked or 0,
        )
        for kind in ("repushed", "rescued", "failed", "orphans_removed"):
            metrics.FIXED.labels(kind).inc(getattr(result, kind))
        metrics.OVERDUE_REPUSHED.inc(result.overdue_repushed)
        metrics.REDIS_CLEANED.labels("expired").inc(cleaned.expired)
        metrics.REDIS_CLEANED.labels("abandoned").inc(cleaned.abandoned)
        metrics.REDIS_CLEANED.labels("dead_workers").inc(cleaned.dead_workers)
        if result.fixed:
            log.info("reconciled: %s", result)
        else:
            self._quiet.count(result)
        return result

    def _report_locked(self, locked: int | None) -> None:
        """Running rows past their lease that a transaction still holds (the rescue skips
        them): a handler inside its fence longer than its lease, or a session left idle in
        its transaction by a client gone without a reset, until the server ends it (the
        worker's ``fence_idle_timeout``; ``idle_in_transaction_session_timeout`` for an
        application's own). Exported, and said at warning while there are any."""
        if locked is None:  # a full batch: the next pass tells
            return
        metrics.LOCKED_PAST_LEASE.set(locked)
        if locked:
            log.warning(
                "%d running schedule(s) past their lease are held locked by another "
                "transaction: not rescued until it ends (docs/deployment.md, the server "
                "settings that bound it)",
                locked,
            )

    def _repush_window(self) -> tuple[int, int, int, datetime]:
        checked = repushed = stuck = 0
        after: tuple[datetime, uuid.UUID] | None = None
        while True:
            with self.core.engine.begin() as conn:
                rows = store.window_page(conn, self.config.window, after, self.config.batch_size)
                now = store.database_now(conn)
                since = now - self.config.stuck_after
                pushes = [
                    Push(r, stuck=r.when_due < since, unpushed=not r.was_pushed) for r in rows
                ]
                result = self.deliverer.push(pushes, now)
                lost = [r for r in rows if r.was_pushed and r.job_id in result.created]
                store.record_repushed(conn, lost)
            checked += len(rows)
            repushed += len(lost)
            stuck += sum(1 for r in lost if r.when_due < since)
            if len(rows) < self.config.batch_size:
                return checked, repushed, stuck, now
            after = (rows[-1].when_due, rows[-1].schedule_id)

    def _remove_orphans(self) -> int:
        """The orphans found (a bounded scan), removed a batch (one script call) at a time."""
        found = [(job, None) for job in orphan_jobs(self.core, self.config.batch_size)]
        size = self.config.batch_size
        return sum(
            sum(self.deliverer.remove_many(found[i : i + size])) for i in range(0, len(found), size)
        )

    def run(
        self, every: timedelta, report: Callable[[ReconcileResult], None] | None = None
    ) -> None:
        """A pass every ``every`` until :meth:`stop` (see :mod:`duejobs.services.loop`). A failed
        pass is retried after ``every`` too: the backoff is capped there, so the rescue bound
        holds right after an outage ends."""
        self._loop.run_forever(self.run_once, lambda _: every, every, every, report=report)


class _QuietPasses:
    """The passes that fixed nothing, summed into one log line every ``every`` (the first
    such pass starts the count)."""

    def __init__(self, every: timedelta) -> None:
        self._every = every.total_seconds()
        self._since: float | None = None
        self._passes = self._checked = self._promoted = 0

    def count(self, result: ReconcileResult) -> None:
        now = time.monotonic()
        if self._since is None:
            self._since = now
        self._passes += 1
        self._checked += result.checked
        self._promoted += result.promoted
        if now - self._since >= self._every:
            log.info(
                "nothing to fix in %d passes over %s (%d rows checked, %d jobs promoted)",
                self._passes,
                spell_duration(timedelta(seconds=round(now - self._since))),
                self._checked,
                self._promoted,
            )
            self._since, self._passes, self._checked, self._promoted = now, 0, 0, 0
