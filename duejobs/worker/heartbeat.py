"""The lease of a running attempt.

:class:`Heartbeat` renews the leases of the attempts running now — every slot's, in one
statement per beat on a connection of its own — so that the reconciler can tell a slow
handler from a dead worker, until a handler's timeout plus its grace has passed; then it
renews that lease no more and calls the attempt's ``overrun`` on a thread of its own (which
closes the attempt and may end the process). A row locked now (the handler's own
``ctx.transaction()``) is skipped for one beat, never waited for.

What it does not promise: a renewal while the database is unreachable (the beat is tried
again at the next; the lease may then expire and the reconciler rescue the attempt, whose
outcome is then recorded ``stale``). Knobs: the worker's ``heartbeat`` and ``lease``.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import timedelta
from typing import TYPE_CHECKING

from duejobs import store
from duejobs.core import Core, connection_ended
from duejobs.models import Delivery

if TYPE_CHECKING:
    from sqlalchemy import Connection

log = logging.getLogger("duejobs.worker")


@dataclass
class Watched:
    """The attempt running now, and what to do if its handler never returns."""

    delivery: Delivery
    give_up_at: float  # monotonic: the handler's timeout plus the grace
    overrun: Callable[[], None]
    renewed_at: float = field(default_factory=time.monotonic)  # the claim set the lease
    fired: bool = False  # the heartbeat gave up on it and called its overrun


class Heartbeat:
    """One thread per worker that renews the leases of the attempts running now — each until
    its handler's timeout plus ``timeout_grace`` has passed. Then it renews that one no more
    and calls its ``overrun`` (which closes the attempt and, unless other slots of the worker
    can still work, ends the process): a handler that swallows its timeout can neither keep
    its lease nor keep the worker."""

    def __init__(self, core: Core, every: timedelta, lease: timedelta) -> None:
        self._core = core
        self._every, self._lease = every, lease
        self._watched: dict[int, Watched] = {}
        self._wakes_at = 0.0  # monotonic: when the thread's current wait ends
        self._conn: Connection | None = None
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._thread = threading.Thread(target=self._run, name="duejobs-heartbeat", daemon=True)
        self._thread.start()

    @contextlib.contextmanager
    def watching(self, watched: Watched) -> Iterator[Watched]:
        """Renew ``watched``'s lease while the block runs; the heartbeat sets ``fired`` on it
        if it gave up on the attempt (its ``overrun`` ran)."""
        due = min(watched.renewed_at + self._every.total_seconds(), watched.give_up_at)
        with self._lock:
            self._watched[id(watched)] = watched
            sooner = due < self._wakes_at
        if sooner:  # the thread sleeps past this attempt's first renewal or its give-up
            self._wake.set()
        try:
            yield watched
        finally:
            with self._lock:
                self._watched.pop(id(watched), None)

    def _next_wait(self, beat: float) -> float:
        """Seconds until the next renewal or give-up due (a beat with none), noted as when
        the thread wakes: an attempt watched meanwhile wakes it only if it is due sooner."""
        with self._lock:
            dues = [min(w.renewed_at + beat, w.give_up_at) for w in self._watched.values()]
            now = time.monotonic()
            wait = max(0.0, min(dues) - now) if dues else beat
            self._wakes_at = now + wait
        return wait

    def _run(self) -> None:
        beat = self._every.total_seconds()
        while not self._stop.is_set():
            self._wake.wait(self._next_wait(beat))
            self._wake.clear()
            if self._stop.is_set():
                return
            now = time.monotonic()
            with self._lock:
                overrun = [w for w in self._watched.values() if now >= w.give_up_at]
                for watched in overrun:
                    watched.fired = True
                    del self._watched[id(watched)]
                due = [w for w in self._watched.values() if now >= w.renewed_at + beat]
            for watched in overrun:  # each on a thread of its own: the others' beats go on
                threading.Thread(target=watched.overrun, name="duejobs-overrun").start()
            for watched in due:
                watched.renewed_at = now
            if due:
                self._renew(due)

    def _renew(self, due: list[Watched]) -> None:
        """One statement for every lease due, on the heartbeat's own connection (never
        waiting for the App's pool, which the handlers use). A connection the server ended
        is replaced before the beat, and one that broke during it is replaced and the beat
        made again at once: a dropped connection costs no beat."""
        for last_try in (False, True):
            try:
                if self._conn is None or connection_ended(self._conn):
                    self._close_connection()
                    self._conn = self._core.connect_directly()
                store.extend_leases(self._conn, [w.delivery for w in due], self._lease)
                return
            except Exception as exc:  # keep beating; the next beat may reach the database
                self._close_connection()
                # Read off the error, not by its class: looking the class up could import
                # SQLAlchemy, which fails once the interpreter is shutting down.
                broken = getattr(exc, "connection_invalidated", False) is True
                if last_try or not broken:
                    log.warning("could not renew %d leases", len(due), exc_info=True)
                    return

    def _close_connection(self) -> None:
        if self._conn is not None:
            with contextlib.suppress(Exception):
                self._conn.invalidate()
                self._conn.close()
            self._conn = None

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        self._thread.join(5)
        self._close_connection()
