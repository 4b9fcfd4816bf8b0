"""Priority on the wire: each queue is three RQ queues, one per band of priorities, which a
worker takes from in order — RQ's own way to rank work (a worker listens to its queues in
the order given), so RQ's tools show each band as the queue it is.

* ``<queue>+high``: priorities above 0;
* ``<queue>``: priority 0 (the default: a queue whose schedules never set one is the RQ queue
  of its name alone, as before priorities existed);
* ``<queue>+low``: priorities below 0.

A queue's name never holds ``+`` (:func:`duejobs.validation.check_queue`), so no queue of a
user's is another's band. On a Redis Cluster the three are ``{<queue>}+high``, ``{<queue>}``
and ``{<queue>}+low``: the queue's hash tag, so that the bands share its slot
(:func:`duejobs.rq_wire.keys.rq_name`). Within a band, jobs go in the order they were pushed (the
scheduler pushes a claim's rows in priority order within each tenant's turn): 10 and 50 share
a band on the wire. A flood of the high band starves neither lower band: at one take in
:data:`RESERVE` a worker serves the default band before the high one, and the low band moves
ahead of the high band at every other such take (:func:`take_order`). No lower band ever
overtakes a higher one but the high band: the low band is served after the default band at
every take, so a tenant's priority-0 work never waits behind its own negative priorities.

Priority ranks a tenant's own work, and the claim's fair shares hold across tenants; on the
wire a band is shared by the queue's tenants. What bounds one tenant's urgent flood for the
others: a *sparse* tenant's next job (fewer than two of its jobs waiting) goes to the front of
its band, so it waits at most ``2 * RESERVE`` takes of a worker, the reserved take of its band,
however long the high band; in-flight quotas bound how many of a tenant's jobs wait at all.
"""

from __future__ import annotations

from collections.abc import Sequence

_HIGH, _LOW = "+high", "+low"
# One take in RESERVE serves the lower bands before the high one: the default band first, then,
# at every other such take, the low band before the high. While the high band floods, the
# default band gets at least one take in RESERVE of a worker's, the low band (when the default
# one is empty) one in 2 * RESERVE.
RESERVE = 8


def band_queue(queue: str, priority: int) -> str:
    """The RQ queue a job of ``queue`` with ``priority`` goes on."""
    if priority > 0:
        return queue + _HIGH
    if priority < 0:
        return queue + _LOW
    return queue


def queue_of(name: str) -> str:
    """The queue whose band is the RQ queue ``name`` (``name`` itself for the default band),
    without the hash tag a cluster's RQ names carry (:func:`duejobs.rq_wire.keys.rq_name`)."""
    for suffix in (_HIGH, _LOW):
        if name.endswith(suffix):
            name = name[: -len(suffix)]
            break
    return name[1:-1] if name.startswith("{") and name.endswith("}") else name


def bands(queues: Sequence[str]) -> list[str]:
    """The RQ queues a worker of ``queues`` listens to, highest band first within each queue,
    the queues in their order: ``a+high, a, a+low, b+high, b, b+low``."""
    return [name for queue in queues for name in (queue + _HIGH, queue, queue + _LOW)]


def take_order(take: int, listened: int) -> list[int]:
    """The order (indexes into :func:`bands`' list of ``listened`` RQ queues) in which the
    worker's take number ``take`` (counted from 1) looks for jobs: each queue in turn, its
    highest band first; at every :data:`RESERVE`-th take, each queue's default band first, then
    its high and low bands — or, at every other such take, its low band before its high one.
    The default band always comes before the low band."""
    usual = list(range(listened))
    if take % RESERVE:
        return usual
    low_turn = (take // RESERVE) % 2 == 0  # every other reserved take
    order = []
    for group in range(0, listened, 3):
        high, default, low = usual[group : group + 3]
        order += [default, low, high] if low_turn else [default, high, low]
    return order
