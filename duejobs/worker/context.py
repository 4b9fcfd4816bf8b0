"""What a handler gets besides the payload: its attempt, and the two ways to act only while
that attempt is still the current one.

``ctx.ensure_current()`` raises :class:`~duejobs.errors.ScheduleChangedError` if the schedule
was cancelled, rescheduled or rescued since the attempt started — call it right before an
external effect. ``with ctx.transaction() as conn:`` is the effect fence: it locks the row and
re-checks it, records ``effect_key`` in the ledger, and commits the handler's own writes
together with ``succeeded`` — exactly once for effects in the same database, and cancel-safe
(a cancel waits for the fence and then finds the schedule finished).
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from duejobs import store
from duejobs.core import Conn, Core
from duejobs.errors import EffectAlreadyAppliedError, ScheduleChangedError
from duejobs.models import Delivery, Status
from duejobs.store import SkipReason

if TYPE_CHECKING:
    from sqlalchemy import Connection, Engine


@dataclass
class Context:
    """What a handler gets besides the payload: the delivery it runs (``schedule_id``,
    ``tenant``, ``version``, ``attempt``, ``queue``), its type, ``run_at`` and payload, and the
    identity of this run (``run_id``)."""

    delivery: Delivery
    type: str
    run_at: datetime
    payload: Any
    _core: Core = field(repr=False)
    # How long the fence's transaction may sit idle on the server (WorkerConfig's knob).
    _fence_idle: timedelta = field(default=timedelta(minutes=1), repr=False)
    # This version's attempts so far that a broken connection ended (not counted as attempts).
    _interruptions: int = field(default=0, repr=False)
    # This run of the handler (see :attr:`run_id`).
    _run_id: uuid.UUID = field(default_factory=uuid.uuid4, repr=False)
    _finished: bool = field(default=False, repr=False)

    @property
    def schedule_id(self) -> uuid.UUID:
        return self.delivery.schedule_id

    @property
    def tenant(self) -> str:
        return self.delivery.tenant

    @property
    def version(self) -> int:
        return self.delivery.version

    @property
    def attempt(self) -> int:
        return self.delivery.attempt

    @property
    def queue(self) -> str:
        return self.delivery.queue

    @property
    def interruptions(self) -> int:
        """This version's attempts so far that failed only because their database connection
        broke: retried without using up ``max_attempts`` (see :mod:`duejobs.worker.closing`)."""
        return self._interruptions

    @property
    def run_id(self) -> uuid.UUID:
        """This run of the handler: the same for the whole run, another for every other run —
        the next attempt's, and a second run of this same attempt in the documented cases
        where one can happen (a worker killed mid-handler, a failover that lost the claim: see
        docs/delivery.md). An effect outside the database can record (:attr:`effect_key`,
        ``run_id``) and so tell a second run of an attempt from the first."""
        return self._run_id

    @property
    def engine(self) -> Engine:
        """The App's engine, for a transaction of the handler's own. Not fenced: an effect
        that must happen once goes through :meth:`transaction`."""
        return self._core.engine

    @property
    def effect_key(self) -> str:
        """``"{type}:{schedule_id}:{version}"``: the same for every attempt of one intent."""
        return f"{self.type}:{self.schedule_id}:{self.version}"

    def ensure_current(self) -> None:
        """Raise :class:`ScheduleChangedError` if the schedule was cancelled, rescheduled or
        rescued since this attempt started. Call it right before an external effect."""
        with self._core.engine.begin() as conn:
            change = store.change_since_claim(conn, self.delivery)
        if change is not None:
            raise ScheduleChangedError(self.schedule_id, change.value)

    @contextlib.contextmanager
    def transaction(self, conn: Conn | None = None) -> Iterator[Connection]:
        """A transaction fenced on this attempt that records the effect and succeeds it.

        Locks the row and re-checks it (:class:`ScheduleChangedError` if it moved on),
        inserts ``effect_key`` into the ledger (:class:`EffectAlreadyAppliedError` if it is
        there), yields the connection for the handler's own writes, then marks the schedule
        ``succeeded`` in the same commit — or, should that find the attempt no longer
        current, rolls everything back.

        ``conn``: run the fence inside a transaction of the handler's own (a plain psycopg
        connection, or Django's through :func:`duejobs.contrib.django.fenced`), whose commit
        then decides; it must commit before the handler returns, or the attempt is left to
        its lease and rescued.

        The transaction bounds itself on the server: PostgreSQL ends its session once it sits
        idle longer than the worker's ``fence_idle_timeout`` (1 min) between two statements
        (``idle_in_transaction_session_timeout``, set for this transaction alone, so nothing
        outlives it on a pooled connection). A client that vanished without a reset (a network
        blackhole) leaves no row locked for the server's TCP keepalive to find, hours later:
        the row is free within that bound, and the reconciler rescues it once its lease ends.
        A shorter limit already in force (the role's, or an application's own transaction's
        with ``conn=``) is kept. A handler idle that long inside the fence has its effect
        rolled back and fails the attempt with the server's error (retried as its retry
        policy says): keep slow work that is not the database's outside the fence.
        """
        if self._finished:
            raise RuntimeError("this attempt already committed its effect")
        scope = (
            contextlib.nullcontext(store.lent(conn, schema=self._core.settings.schema))
            if conn is not None
            else self._core.engine.begin()
        )
        with scope as conn:
            change = store.change_since_claim(conn, self.delivery, fence_idle=self._fence_idle)
            if change is not None:
                raise ScheduleChangedError(self.schedule_id, change.value)
            if not store.record_effect(
                conn, self.effect_key, self.schedule_id, self.tenant, self.version
            ):
                raise EffectAlreadyAppliedError(f"effect {self.effect_key} was already applied")
            yield conn
            closing = store.Closing(self.delivery, Status.SUCCEEDED)
            if not store.finish(conn, [closing])[0]:
                # cannot happen while the row lock holds; if it did, nothing commits
                raise ScheduleChangedError(self.schedule_id, SkipReason.DUPLICATE.value)
        self._finished = True
