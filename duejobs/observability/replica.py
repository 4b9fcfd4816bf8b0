"""Reads off the primary: the operators' figures and lists from a streaming replica.

With ``DUEJOBS_READ_DATABASE_URL`` (or ``App(read_database_url=...)``) naming a streaming
replica of the primary, these read there: ``duejobs stats`` and
:func:`duejobs.services.stats.collect`
(so the reconciler's gauges, ``--stats-every``), the start lag over time, :meth:`App.list
<duejobs.App.list>` and ``duejobs list``, the list of recurring definitions, and the
dashboard's overview and lists. Every decision stays on the primary: the claim and the push,
a worker's revalidation and outcome, cancel, reschedule, retry, the reconciler's rescue,
re-push and orphan removal. So do ``App.get``, ``history`` and ``attempts``: a caller reads
there what it has just written (the dashboard's page of one schedule, shown again after an
action, is one of them), and they cost a few index lookups.

**How current a read is.** Before reading, the primary's log position is read (one statement,
no table; records not yet written included), then the replica says whether it has replayed
that far, given half a second (``CATCH_UP_WAIT``) to get there. If it has, the read is
*current*: it sees every transaction committed before it began. If not, its ``lag`` is the age
of the last transaction the replica replayed — an upper bound: everything committed up to
that transaction is seen, anything later may not be. A read whose lag is over ``max_lag``
(``App(read_max_lag=)``, default 10 s), or unknown (a replica that has replayed nothing since
it started), is **stale** and says so instead of passing for current: ``Stats.freshness`` and
``Page.freshness`` tell it, ``duejobs stats`` and ``duejobs list`` print a warning, the
dashboard shows a banner.

Metrics: ``duejobs_read_replica_lag_seconds``, set at each read from the replica (0 when
current; +Inf when unknown, or when the replica does not answer, so that a lag alert fires for
a replica that is down too); ``duejobs_read_replica_up``, 1 while the last read from the
replica was answered, 0 once one was not.

What it does not do: fall back to the primary when the replica is stale or down (the
operators' reads would land on the primary when it is busiest; a replica that does not answer
raises :class:`~duejobs.errors.DatabaseUnavailableError` naming it); spread reads over several
replicas (put a pooler or a DNS name in front); notice a read URL that names some other
primary rather than a replica (a server that is not in recovery is taken as current).
"""

from __future__ import annotations

import math
import time
from datetime import timedelta
from typing import TYPE_CHECKING

from duejobs import store
from duejobs.models import CURRENT, Freshness
from duejobs.observability.metrics import OwnedGauge

if TYPE_CHECKING:
    from sqlalchemy import Connection

__all__ = [
    "CURRENT",
    "DEFAULT_MAX_LAG",
    "REPLICA_LAG",
    "REPLICA_UP",
    "Freshness",
    "freshness",
    "measure",
    "unanswered",
]

DEFAULT_MAX_LAG = timedelta(seconds=10)
# How long a read waits for a replica that has not yet replayed the primary's position.
CATCH_UP_WAIT = 0.5

REPLICA_LAG = OwnedGauge(
    "duejobs_read_replica_lag_seconds",
    "How far behind the primary the read replica's last read was (0: current).",
)


REPLICA_UP = OwnedGauge(
    "duejobs_read_replica_up",
    "1 while the read replica answered the last read from it, 0 once one was not answered.",
)


def unanswered() -> None:
    """The replica did not answer a read: of unknown lag, and down (in that order: whoever
    sees it down sees the lag unknown)."""
    REPLICA_LAG.set(math.inf)
    REPLICA_UP.set(0)


def measure(conn: Connection, lsn: str, max_lag: timedelta) -> Freshness:
    """How current a read on the replica ``conn`` is, against the primary's position
    ``lsn``: a replica a moment behind (the last records not yet streamed or replayed) is
    given ``CATCH_UP_WAIT`` to reach it, so a healthy one reads as current."""
    deadline = time.monotonic() + CATCH_UP_WAIT
    position = store.replay_position(conn, lsn)
    while position.in_recovery and not position.caught_up and time.monotonic() < deadline:
        time.sleep(0.02)
        position = store.replay_position(conn, lsn)
    return freshness(position, max_lag)


def freshness(position: store.ReplayPosition, max_lag: timedelta) -> Freshness:
    """A replica's read, as current as :func:`store.replay_position` says (see the module
    docstring); the lag is exported."""
    if position.caught_up or not position.in_recovery:
        lag: timedelta | None = timedelta(0)
    elif position.behind is None:
        lag = None
    else:
        lag = max(position.behind, timedelta(0))
    REPLICA_LAG.set(math.inf if lag is None else lag.total_seconds())
    REPLICA_UP.set(1)
    return Freshness("replica", lag, max_lag)
