"""The scheduler's side of rate limits: the rows under a limit wait in PostgreSQL, not in Redis.

A worker grants each start under a rate limit (a GCRA on the limit's row, by the database
clock: duejobs.store.rate_limits) and turns back a start that comes too soon. Were the
scheduler to push every due row of a limited queue, its backlog would wait in Redis — where
RQ serves a worker's queues in the order given, so the queues listed after it wait behind it
— and workers would take and turn back its jobs again and again. So the claim pushes, of the
rows under a limit, only the starts the limit's pace has room for within ``PACE_AHEAD``, each
due at a slot of its own (the row's due time moved there, a ``requeued`` event keeping the one
it moved from, so its expiry counts from that), and moves the limit's pointer
(``paced_until``) past the last slot given — last, once the rows are pushed: the limit's row
is what the workers' grants lock. The rest wait in the table, where the claim's walk
over (tenant, queue) pairs steps past them.

What it promises: Redis holds at most a horizon's starts of each limit (besides jobs pushed
before the limit was set, which the worker's grant paces). The pairs under one limit share
its room fairly (the claim's water-filling) and the slots go to the rows in the claim's turns,
so a tenant with ten rows waits no longer than the busy tenant's first ten. A limit set,
changed or cleared is read by the next claim (a change resets the pointer:
duejobs.store.rate_limits). Two claims never give out the same slots: a claim holds each limit
it paces to its commit (a transaction-scoped advisory lock), and a claim that finds one held
leaves that limit's pairs to the next one.

What it does not: decide the start. The worker's grant does; a job that reaches its slot late
(a busy worker) starts when it is taken, and a slot given to a row that is then cancelled
goes unused. Fairness among more pairs than one claim walks is by the walk's turns of claims.

A paced job goes onto its queue a little ahead of its slot: at the start of the slot's step
on a grid ``GROUP`` wide, so that at a fast limit's pace the jobs of one step reach a worker
together — one promotion moves them, one statement of the worker claims them, its grant
giving each its slot, which the worker's slot waits for (a start granted up to
``duejobs.worker.claims.RATE_LIMIT_WAIT`` ahead). One by one, each start cost a promotion
and a claim of its own: at 200/s, 5.6 ms of the machine's CPU a job against 0.7 ms for a job
of an unlimited backlog.

Knobs: ``PACE_AHEAD`` (1 s): shorter keeps fewer of a limit's jobs in Redis, longer rides out
a slower scheduler pass without a gap in the limit's starts. ``GROUP`` (25 ms): under the
worker's wait, with room for a late promotion.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING

from duejobs import store

if TYPE_CHECKING:
    import uuid

    from sqlalchemy import Connection

PACE_AHEAD = timedelta(seconds=1)
GROUP = timedelta(milliseconds=25)

Key = tuple[str, str]  # a limit: (scope, name)


def group_of(slot: datetime) -> datetime:
    """When a job paced for ``slot`` goes onto its queue: the start of its step of the grid."""
    step = GROUP.total_seconds()
    return datetime.fromtimestamp(math.floor(slot.timestamp() / step) * step, UTC)


def limits_of(pair: store.PairDue) -> dict[Key, timedelta]:
    """The limits in force on a pair, with the interval between their starts."""
    limits: dict[Key, timedelta] = {}
    if pair.queue_every is not None:
        limits["queue", pair.queue] = pair.queue_every
    if pair.tenant_every is not None:
        limits["tenant", pair.tenant] = pair.tenant_every
    return limits


@dataclasses.dataclass(frozen=True)
class Pacing:
    """The limits one claim holds, and when each one's next start may come."""

    now: datetime
    every: dict[Key, timedelta]
    # When each limit this claim holds (its advisory lock) is due its next start at its
    # pace (its theoretical arrival time, in GCRA's words): never before now.
    next_start: dict[Key, datetime]
    # The tenants' counts under the default among them (made with their pointer if missing).
    counts: frozenset[Key] = frozenset()

    @classmethod
    def hold(cls, conn: Connection, pairs: Sequence[store.PairDue], now: datetime) -> Pacing:
        """Hold, to the claim's commit, the limits in force on ``pairs`` that no other claim
        is pacing (a tenant with no count yet is paced from now; its count is made with
        its pointer)."""
        every = {key: each for pair in pairs for key, each in limits_of(pair).items()}
        if not every:
            return cls(now, {}, {})
        held = store.pace_limits(conn, sorted(every))
        due = {  # the later of the two paces, or now for a limit idle since
            (h.scope, h.name): max(t for t in (h.paced_until, h.started_until, now) if t)
            for h in held
        }
        counts = frozenset((h.scope, h.name) for h in held if h.follows_default)
        return cls(now, every, due, counts)

    def room(self, key: Key) -> int:
        """How many starts the limit has from its due time to ``PACE_AHEAD`` from now, one
        interval apart. Its grant's one start of tolerance is left unused: the slack that
        lets a job reach the worker a little sooner after its slot than the one before it
        (a late start moves the grant's pace on) and still start."""
        due = self.next_start.get(key)
        until = self.now + PACE_AHEAD
        if due is None or due > until:
            return 0
        return (until - due) // self.every[key] + 1

    def under(self, pairs: Sequence[store.PairDue]) -> dict[Key, list[int]]:
        """Each limit in force, with the positions of the pairs under it."""
        positions: dict[Key, list[int]] = {key: [] for key in self.every}
        for i, pair in enumerate(pairs):
            for key in limits_of(pair):
                positions[key].append(i)
        return positions

    def place(
        self,
        conn: Connection,
        rows: Sequence[store.ClaimedRow],
        pairs: Sequence[store.PairDue],
    ) -> tuple[dict[uuid.UUID, datetime], list[store.Pace]]:
        """Give each row under a limit its slot, in the claim's order: the latest of its due
        time and each of its limits' due time, which then moves one interval past the slot.
        Rows whose slot is ahead are moved there. Returns every paced row's slot, and each
        limit's new due time, for :func:`~duejobs.store.advance_paces` once the claim's rows
        are pushed."""
        limits = {(p.tenant, p.queue): limits_of(p) for p in pairs}
        due_next = dict(self.next_start)
        slots: dict[uuid.UUID, datetime] = {}
        moved: list[tuple[uuid.UUID, datetime, datetime]] = []
        for row in rows:
            keys = [key for key in limits.get((row.tenant, row.queue), {}) if key in due_next]
            if not keys:
                continue
            due = row.due_at or self.now  # a claimed row always has its due time
            slot = max(due, *(due_next[key] for key in keys))
            for key in keys:
                due_next[key] = slot + self.every[key]
            slots[row.schedule_id] = slot
            if slot > self.now and slot > due:
                moved.append((row.schedule_id, slot, due))
        if moved:
            store.pace_rows(conn, moved)
        paces = [  # in (scope, name) order: the order the workers' grants lock them in
            store.Pace(*key, at, self.every[key], key in self.counts)
            for key, at in sorted(due_next.items())
            if at != self.next_start[key]
        ]
        return slots, paces
