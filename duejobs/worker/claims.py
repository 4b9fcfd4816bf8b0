"""The worker's claims: a delivery becomes a running attempt, or is told why it cannot.

:class:`Claimer` claims each delivery in one statement (:func:`~duejobs.store.claim_runs`):
its tenant's row ``scheduled`` at the delivered version, this being its next attempt, due by
the **database's** clock, of a type this worker has a handler for → ``running`` with a lease.
Deliveries that arrive together share that statement (:mod:`duejobs.worker.group_commit`), and those
taken from Redis together are claimed *ahead* (:meth:`Claimer.claim_ahead`), on threads of
their own, while their jobs are handed to their slots.

What it promises:

* every answer of a batched claim is matched on the whole delivery (schedule, version,
  attempt, tenant, queue): a superseded copy taken beside the current one never runs with
  its claim, and a second copy of one delivery finds it claimed (``duplicate``);
* no handler starts on a claim made ahead that the reconciler may take back before the
  heartbeat's first renewal: one older than a heartbeat is renewed under the row lock first,
  and once rescued it is never used (``lapsed``: the attempt the rescue pushed runs instead);
* a claim whose statement lost its answer (the connection broken, the database unreachable)
  is looked for by the statement's name, recorded in its ``started`` event: one that
  committed is used, once, by one copy of the delivery; one that did not is made again on a
  fresh connection;
* a delivery that came early waits for its time when that is within ``max_early_wait`` (by
  the database's own reading of how far away it is), then claims again; one whose row an
  application transaction holds waits at most ``claim_lock_timeout``;
* a start under a rate limit starts at the time its limit grants: now, or, when the limit's
  pace gives it a slot within ``RATE_LIMIT_WAIT`` (a few of a fast limit's intervals), that
  slot — claimed in the same statement, and waited for in the worker's slot before its
  handler starts (the attempt's ``started_at``). At a limit's pace the next start is
  milliseconds away: a trip back through the scheduler would miss it, and the limit's rate be
  lost; and the scheduler sends a fast limit's jobs a little ahead of their slots, in groups
  one statement claims. A start further off turns back to the table, for the scheduler to
  push again at the limit's pace, so a slow limit holds no slot: that turn-back is in the
  schedule's history (a ``requeued`` event) and counts in
  ``duejobs_rate_limited_deliveries_total``. The scheduler may push it again before this
  worker has finished the job it took in RQ: its push replaces a job a live worker holds for
  a row with no queue job, and the worker's finish, which writes only while its run's entry
  is in the started registry, then writes nothing.

What it does not do: run or close anything (:mod:`duejobs.worker.runtime`,
:mod:`duejobs.worker.closing`).
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from datetime import timedelta

from duejobs import store
from duejobs.core import Core
from duejobs.models import Delivery
from duejobs.store import RunClaim, SkipReason, dbapi
from duejobs.worker.bookkeeping import Bookkeeping, lock_busy, unreachable
from duejobs.worker.config import WorkerConfig
from duejobs.worker.group_commit import GroupCommit

log = logging.getLogger("duejobs.worker")
# Threads that run the claims of deliveries taken together (:meth:`Claimer.claim_ahead`).
_CLAIMERS = 4
# Seconds before a claim whose connection broke or was refused is made again.
_CLAIM_AGAIN_AFTER = 0.2
# Seconds ahead a rate limit's grant may give a start, the worker's slot waiting for it.
RATE_LIMIT_WAIT = 0.05


@dataclass(frozen=True)
class _ClaimAhead:
    """A delivery's places in the claim of a batch taken together (running or done), and
    when that claim was asked for (``time.monotonic()``: its lease began no earlier)."""

    claims: Future[list[RunClaim | None]]
    places: list[int]
    asked_at: float

    def claim(self) -> RunClaim | None:
        """The claim this batch made of the delivery, once it committed; None when it made
        none or failed (logged once for the batch): the slot then claims alone."""
        try:
            made = self.claims.result()
        except Exception:
            return None
        return next((made[at] for at in self.places if made[at] is not None), None)

    def made_none(self) -> bool:
        """Its batch committed without claiming the delivery (or failed)."""
        return self.claims.done() and self.claim() is None


class Claimer:
    """Claims for one worker (its ``name``, its handlers' types, its ``lease``)."""

    def __init__(
        self, core: Core, config: WorkerConfig, bookkeeping: Bookkeeping, name: str
    ) -> None:
        self._core, self._config, self._bookkeeping, self._name = core, config, bookkeeping, name
        # The claims, in one group commit per queue (the worker serves a fixed list): a queue's
        # rate limit locks its row for the statement that grants its starts, which the other
        # queues' claims then need not wait for.
        self._claims: dict[str, GroupCommit[Delivery, RunClaim | None]] = {}
        # Deliveries taken from Redis together, each with the claims of the batches that
        # carried it (running or done) and its places in them (copies of one delivery may
        # arrive together, or in two batches), until a slot runs it. The claims run on
        # threads of their own, so the thread that takes jobs goes on taking while they
        # commit; a few of them, so batches that queue meanwhile share the next statement.
        self._ahead: dict[Delivery, list[_ClaimAhead]] = {}
        # Deliveries whose claim statement lost its answer (the connection broken as it ran),
        # with that statement's name (it may have committed) and when: kept a lease at most
        # (past it, a claim that landed is the reconciler's to rescue, and the delivery that
        # comes back for this process, if any, is asked afresh).
        self._unanswered: dict[Delivery, tuple[str, float]] = {}
        self._lock = threading.Lock()
        self._threads = ThreadPoolExecutor(_CLAIMERS, thread_name_prefix="duejobs-claim")

    def _group(self, queue: str) -> GroupCommit[Delivery, RunClaim | None]:
        """The group commit of ``queue``'s claims."""
        with self._lock:
            group = self._claims.get(queue)
            if group is None:
                group = self._claims[queue] = GroupCommit("claim", self._claim_batch)
            return group

    def close(self) -> None:
        self._threads.shutdown(wait=True)

    @property
    def waiting(self) -> int:
        """Deliveries claimed ahead that no slot has run yet."""
        with self._lock:
            return len(self._ahead)

    @property
    def unanswered(self) -> int:
        """Deliveries whose claim lost its answer, kept to ask whether it landed."""
        with self._lock:
            return len(self._unanswered)

    def claim_ahead(self, deliveries: Sequence[Delivery]) -> None:
        """Have deliveries taken from Redis together claimed in one statement per queue (see
        ``_claims``), each for the slot that will run it (see :meth:`claim`); returns at once,
        the statements running meanwhile. A delivery that cannot run now, or a statement that
        failed, is left to its slot, which claims it alone and says why."""
        by_queue: dict[str, list[Delivery]] = {}
        for delivery in deliveries:
            by_queue.setdefault(delivery.queue, []).append(delivery)
        for batch in by_queue.values():
            self._claim_batch_ahead(batch)

    def _claim_batch_ahead(self, batch: list[Delivery]) -> None:
        asked_at = time.monotonic()
        claims = self._threads.submit(self._claim_together, batch)
        places: dict[Delivery, list[int]] = {}
        for place, delivery in enumerate(batch):
            places.setdefault(delivery, []).append(place)
        with self._lock:
            for delivery, at in places.items():
                self._ahead.setdefault(delivery, []).append(_ClaimAhead(claims, at, asked_at))

    def claim(self, delivery: Delivery) -> RunClaim | None:
        """The delivery's claim: the one made ahead, if any (in time, see :meth:`_in_time`),
        else its own; one that cannot run now is told why
        (:func:`~duejobs.store.claim_verdict`), and one that came early waits for its time
        when that is close, then claims again. A start a rate limit granted for its slot just
        ahead is returned at that slot. None: its row (or the row of a rate limit over it)
        stayed locked past ``claim_lock_timeout``."""
        claim = self._claim_once(delivery)
        if claim is not None and claim.skip is None:
            ahead = claim.not_before - time.monotonic()
            if ahead > 0:
                time.sleep(ahead)
        return claim

    def _claim_once(self, delivery: Delivery) -> RunClaim | None:
        with self._lock:  # its copies taken with it find none, and claim alone
            ahead = self._ahead.pop(delivery, [])
        for taken in ahead:
            claim = taken.claim()
            if claim is not None:
                return self._in_time(delivery, claim, taken.asked_at)
        give_up = time.monotonic() + self._config.max_early_wait.total_seconds()
        locked_until = time.monotonic() + self._config.claim_lock_timeout.total_seconds()
        while True:
            try:
                claim = self._landed(delivery) or self._submit(delivery)
            except dbapi.DBAPIError as exc:  # a rate limit's row held past the lock limit
                if not lock_busy(exc):
                    raise
                return None
            if claim is not None:
                return claim
            try:
                with self._bookkeeping.connection() as conn:
                    verdict = store.claim_verdict(
                        conn, delivery, worker=self._name, types=self.types()
                    )
            except dbapi.DBAPIError as exc:
                if not lock_busy(exc):
                    raise
                return None
            if verdict.skip is None:  # its row was locked when the claim looked
                if time.monotonic() > locked_until:
                    return None
                continue
            if verdict.skip is not SkipReason.NOT_DUE:
                return verdict
            assert verdict.due_at is not None and verdict.db_now is not None
            remaining = (verdict.due_at - verdict.db_now).total_seconds()
            if time.monotonic() + remaining > give_up:
                return verdict
            time.sleep(remaining)

    def _submit(self, delivery: Delivery) -> RunClaim | None:
        """The delivery's claim in a batch; when the batch's statement lost its answer (ended
        by the server, a pooler or a failover), the claim it may have committed, else made
        once more on a fresh connection."""
        claims = self._group(delivery.queue)
        try:
            return claims.submit(delivery)
        except dbapi.DBAPIError as exc:
            if not unreachable(exc):
                raise
            log.warning("the claim was not answered (%s); claiming again", exc.orig)
            time.sleep(_CLAIM_AGAIN_AFTER)  # a pooler or a server coming back
            return self._landed(delivery) or claims.submit(delivery)

    def _landed(self, delivery: Delivery) -> RunClaim | None:
        """The claim a statement that lost its answer made of the delivery, if it committed
        one; asked once (a copy of the delivery taken beside it finds none, and claims alone:
        ``duplicate``)."""
        with self._lock:
            if not self._unanswered:
                return None
            self._forget_past_a_lease()
            lost = self._unanswered.pop(delivery, None)
        if lost is None:
            return None
        try:
            with self._bookkeeping.connection() as conn:
                landed = store.claim_landed(conn, delivery, lost[0])
        except BaseException:
            with self._lock:  # still unknown: asked again at the next try
                self._unanswered.setdefault(delivery, lost)
            raise
        # Made when its statement was sent: renewed first if that is a heartbeat ago or more.
        return None if landed is None else self._in_time(delivery, landed, lost[1])

    def _in_time(self, delivery: Delivery, claim: RunClaim, asked_at: float) -> RunClaim:
        """A claim made ahead, if its handler may still start on it: made less than a
        heartbeat ago (the heartbeat's first renewal comes a heartbeat after the handler
        starts, well within the lease); otherwise renewed first — its start was held up
        (Redis failing as it started, say) — and, once the reconciler has rescued it, never
        used: the attempt the rescue pushed runs instead."""
        if (
            claim.skip is not None
            or time.monotonic() - asked_at < self._config.heartbeat.total_seconds()
        ):
            return claim  # a heartbeat renews it before a lease less a heartbeat has passed
        with self._bookkeeping.connection() as conn:
            renewed = store.renew_claim(conn, delivery, self._config.lease)
        if renewed:
            return claim
        return RunClaim(skip=SkipReason.LAPSED, type=claim.type)

    def _claim_together(self, batch: list[Delivery]) -> list[RunClaim | None]:
        try:
            return self._group(batch[0].queue).submit_all(batch)
        except Exception:
            log.exception("could not claim %d deliveries together", len(batch))
            raise

    def _claim_batch(self, deliveries: Sequence[Delivery]) -> list[RunClaim | None]:
        claim = uuid.uuid4().hex
        sent: float | None = None  # a connect refused sent nothing: nothing can have committed
        try:
            with self._bookkeeping.connection() as conn:
                sent = time.monotonic()
                return store.claim_runs(
                    conn,
                    deliveries,
                    worker=self._name,
                    lease=self._config.lease,
                    types=self.types(),
                    claim=claim,
                    hold=timedelta(seconds=RATE_LIMIT_WAIT),
                )
        except dbapi.DBAPIError as exc:
            if sent is not None and unreachable(exc):  # it may have committed: each asks
                self._lost_answer(deliveries, claim, sent)
            raise

    def _lost_answer(self, deliveries: Sequence[Delivery], claim: str, sent: float) -> None:
        """Keep the deliveries of a claim statement sent at ``sent`` that lost its answer
        (see :meth:`_landed`), and let go of those kept past a lease since sent."""
        with self._lock:
            self._forget_past_a_lease()
            self._unanswered.update(dict.fromkeys(deliveries, (claim, sent)))

    def _forget_past_a_lease(self) -> None:
        """(Under the lock.) Let go of the lost answers kept longer than a lease: a claim of
        theirs that landed is the reconciler's to rescue by now."""
        oldest = time.monotonic() - self._config.lease.total_seconds()
        for delivery in [d for d, (_, at) in self._unanswered.items() if at < oldest]:
            del self._unanswered[delivery]

    def types(self) -> list[str]:
        """The types this worker has handlers for: the only ones it claims."""
        return list(self._core.handlers)
