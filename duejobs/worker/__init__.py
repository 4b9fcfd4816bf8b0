"""The worker: runs a delivery only if the database says it is current and due.

For each delivery (schedule id, version, attempt, tenant — never the payload) the worker:

1. **Claims the row in one statement**: the tenant's row, ``scheduled`` at the delivered
   version, this being the next attempt, and ``due_at`` reached by the **database's** clock →
   ``running`` with an attempt row, a ``started`` event and a lease. The worker's own clock is
   never consulted, so a worker whose clock is ten minutes off behaves like any other.
   Deliveries taken from Redis together (one per free slot) are claimed in that same one
   statement, and so are outcomes that arrive together (:mod:`duejobs.worker.group_commit`).
2. **Otherwise skips, and records why**: missing, cancelled, superseded (another version),
   duplicate (already running or done — RQ can deliver one id twice), expired (later than
   the schedule's ``expires_after``; the schedule is then cancelled). A delivery that arrived
   early waits up to ``max_early_wait`` (measured against the database's answer), or is put
   back into the scheduled registry for ``due_at`` under its own id; no attempt is consumed.
   A delivery of a type this worker has no handler for is not claimed either: it goes back
   for a worker that has one (a rolling deploy updates producers first), after as long again
   as it has been put back (1 s to 1 min), for ``unknown_type_grace`` after the first; then
   it fails for good, naming its type (counted in ``duejobs_unknown_type_deliveries_total``).
3. **Runs the handler** with ``ctx`` (ids, version, attempt, ``effect_key``, ``run_at``, and
   the payload read from the row now) under the type's timeout, while a heartbeat thread
   extends the lease so the reconciler can tell a slow handler from a dead worker. An
   ``async def`` handler runs to completion on an event loop of its slot (``ctx``'s methods
   are synchronous and may be called from it).

   **Hard time limits.** At the timeout :class:`~duejobs.errors.HandlerTimeoutError` — a
   ``BaseException``, so ``except Exception`` cannot swallow it — is raised in the handler,
   and again every second until it returns; the attempt fails and is retried per the type's
   policy. A handler still running ``timeout_grace`` after its timeout loses its lease (the
   heartbeat stops renewing it), its attempt is closed as timed out by the heartbeat thread,
   and the worker process exits with status 70 (``EXIT_WEDGED``) for its supervisor to start
   a fresh one (compose ``restart: unless-stopped``, systemd ``Restart=always``); if the
   database cannot be reached then, the lease expires and the reconciler rescues the row.

   **Slots** (``concurrency`` N > 1: each delivery in a thread of the worker's pool, see
   :mod:`duejobs.worker.slot_pool`). A thread cannot be interrupted from outside: a
   sync handler gets the timeout at its next Python instruction (not inside a blocking call,
   see :func:`~duejobs.worker.time_limits.time_limit`); an ``async def`` one is cancelled at
   its timeout.
   A handler still running ``timeout_grace`` later is given up as above — attempt closed,
   lease released, whatever it does afterwards recorded ``stale`` by the fence — but only its
   slot waits for it: the process exits with ``EXIT_WEDGED`` once every slot is given up.
4. **Closes the attempt** only if it is still current: ``succeeded``; or, on an exception,
   another attempt after exponential backoff with full jitter (``run_at`` is never touched;
   ``due_at`` and the attempt row carry the retry time), or ``failed`` with ``last_error``
   once attempts are exhausted; rows are never deleted. If the schedule changed meanwhile,
   the attempt is recorded as ``stale``.

Effects: ``ctx.ensure_current()`` raises :class:`~duejobs.errors.ScheduleChangedError` before
an external effect if the schedule moved on. ``with ctx.transaction() as conn:`` fences on the
current attempt (row lock), records ``effect_key`` in the ledger and commits the handler's own
writes together with ``succeeded``: exactly once for effects in the same database, and
cancel-safe (a cancel waits for the fence and then finds the schedule finished).

What it does not promise: exactly-once for external effects (pass ``ctx.effect_key`` as the
idempotency key). It can run a handler twice when: its worker is killed (SIGKILL, cold
shutdown) — the row stays ``running`` until its lease expires and the reconciler rescues it;
or PostgreSQL itself crashes, or fails over to a standby that had not received them — the
worker's claim and outcome commits use ``synchronous_commit = off`` (about 1 ms per job
less), so the last fraction of a second of them can be lost and the schedule runs again; or
the database stays unreachable past the lease after the handler returned. A connection
dropped around the handler never does: parked connections are checked before use, an outcome
is recorded again on a fresh connection until its lease ends, and one whose commit landed
though its answer was lost is recognised (:mod:`duejobs.worker.closing`). One dropped inside
the handler's own ``ctx.transaction()`` fails that attempt, retried by the type's policy.
Effects committed through ``ctx.transaction()`` use the application's durable commits and stay
exactly-once in every case.

A claim waits at most ``claim_lock_timeout`` (2 s) for a row lock an application
transaction holds; then the delivery goes back to the scheduled registry for a second later,
under its own id, without using an attempt.

Knobs (:class:`WorkerConfig`, checked when built): ``lease`` (20 s), ``heartbeat`` (5 s, at
most a third of the lease), ``max_early_wait`` (1 s), ``durable_bookkeeping`` (False: set True
to fsync every claim and outcome), ``timeout_grace`` (10 s), ``claim_lock_timeout`` (2 s),
``concurrency`` (1: deliveries one at a time, in the main thread; the App's connection pool
grows to two connections per slot), ``take_window`` (10 ms, at most 1 s, 0 for none;
with ``concurrency`` above 1 only: how long a slot freed while others run waits for the
handlers taken together with its own (once per batch) before the worker takes jobs — jobs
taken together are claimed and started together, which costs far less per job; see
:mod:`duejobs.worker.slot_pool`), ``switch_interval`` (20 ms, at most 1 s; with
``concurrency`` above 1 only: the interpreter's switch interval while the worker works,
restored after — how long a thread may hold the GIL while another waits for it. Python's
5 ms makes many slots' threads hand the GIL over more often than their work needs; a handler
that computes keeps the others waiting up to this long), ``unknown_type_grace`` (15 min).

Metrics: ``duejobs_deliveries_total{tenant,type,outcome}``, ``duejobs_lag_seconds``, and
``duejobs_worker_batch_size{kind}`` (claims or outcomes per bookkeeping statement).

Where each part lives, one role per module: :mod:`.loop` (the loop: take → claim → run →
close, signals, stops; what it reads and writes in RQ's layout is
:mod:`duejobs.rq_wire.worker_side`), :mod:`.redis_waits` (outages waited out), :mod:`.runtime` (one
delivery from claim to outcome), :mod:`.claims` (claims, and those made ahead for jobs taken
together), :mod:`.closing` (outcomes), :mod:`.slot_pool` (slots, takes, the warm-stop drain;
no RQ), :mod:`.heartbeat` (leases), :mod:`.time_limits`, :mod:`.bookkeeping` (connections),
:mod:`.event_loops` (``async def`` handlers), :mod:`.context` (``ctx``), :mod:`.supervisor`
(``--processes``), :mod:`.config` (the knobs). The worker is built in one place,
:func:`build_worker`. Its names are imported on first use, so that the knobs
(:mod:`.config`) load without the worker.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from duejobs.lazy import lazy_exports

if TYPE_CHECKING:
    from duejobs.core import HasCore
    from duejobs.worker.config import EXIT_WEDGED, MAX_CONCURRENCY, Outcome, WorkerConfig
    from duejobs.worker.context import Context
    from duejobs.worker.loop import Worker
    from duejobs.worker.runtime import Runtime, perform

_HOMES = {
    "EXIT_WEDGED": "duejobs.worker.config",
    "MAX_CONCURRENCY": "duejobs.worker.config",
    "Outcome": "duejobs.worker.config",
    "WorkerConfig": "duejobs.worker.config",
    "Context": "duejobs.worker.context",
    "Worker": "duejobs.worker.loop",
    "Runtime": "duejobs.worker.runtime",
    "perform": "duejobs.worker.runtime",
}
__getattr__, __dir__ = lazy_exports(__name__, _HOMES, globals())


def build_worker(
    app: HasCore,
    config: WorkerConfig | None = None,
    queues: Sequence[str] = (),
    name: str | None = None,
) -> Worker:
    """A worker for ``app``'s handlers on ``queues`` (default: the App's queue), with its own
    runtime (close it with ``worker.runtime.close()`` once the worker returned)."""
    from duejobs.worker.loop import Worker
    from duejobs.worker.runtime import Runtime

    runtime = Runtime(app, config, name=name)
    try:
        return Worker(runtime, queues)
    except BaseException:  # a queue refused: nothing left open
        runtime.close()
        raise


__all__ = [
    "EXIT_WEDGED",
    "MAX_CONCURRENCY",
    "Context",
    "Outcome",
    "Runtime",
    "Worker",
    "WorkerConfig",
    "build_worker",
    "perform",
]
