"""The pruner: deletes finished schedules and their history once they are old enough.

Each pass (:meth:`Pruner.run_once`) first drops, in partitioned mode, the ranges of schedules
that hold nothing live and nothing finished within ``older_than`` (whole partitions, see
:mod:`duejobs.services.partition_maintenance`), then deletes, in batches of ``batch_size`` each
committed on its own, the schedules that finished (``succeeded``, ``failed``, ``cancelled``) more
than ``older_than`` ago, with their events, attempts and effect-ledger rows, until a batch comes
back short (each span of ids its own batches) — in partitioned mode except those of the ranges begun
before the horizon (now - ``older_than``), ended less than a period before it, that hold nothing
live and did not find their tables busy: they wait to be dropped whole
(:func:`duejobs.services.partition_maintenance.batch_spans`). ``duejobs prune`` runs one pass, or
one every ``--every``.

What it promises: a live row (``scheduled``, ``running``) is never deleted, whatever its age;
each batch holds its row locks for one short transaction, so schedulers, workers and
applications go on meanwhile; a pass stopped midway (or killed) leaves whole schedules — the
batches it committed are gone with their history, the others are untouched. The application's
own tables are never touched.

Each pass also deletes the rate-limit counts of tenants that follow the default limit and
started nothing for ``RATE_COUNTS_IDLE`` (10 min): one row per such tenant, which their next
start makes again (:mod:`duejobs.store.rate_limits`).

What it does not promise: in partitioned mode, removal at ``older_than`` sharp — a finished
schedule may stay up to two periods (14 days with weekly ranges) past ``older_than``, plus the
time to the next pass, until its range drops or is sent back to the batches; a deployment that
must erase by a deadline keeps the plain schema or sets ``older_than`` two periods short of it.
Nor a bound on a pass's duration — it follows how much finished history has piled up
(measured in ``bench/``: about 100k rows/s here, two thirds of the rate of one unbatched
DELETE).

Metrics: ``duejobs_pruned_total``, ``duejobs_pruner_failed_passes_total``.

Knobs (:class:`PruneConfig`, checked when built): ``older_than`` (30 days), ``batch_size``
(1000).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta

from duejobs import store
from duejobs.core import HasCore
from duejobs.observability import metrics
from duejobs.services import partition_maintenance
from duejobs.services.loop import Loop
from duejobs.validation import check_count, check_duration

log = logging.getLogger("duejobs.prune")

DEFAULT_OLDER_THAN = timedelta(days=30)
# How long a tenant that follows the default rate limit starts nothing before its count goes
# (a count made afresh at its next start grants exactly the same: duejobs.store.rate_limits).
RATE_COUNTS_IDLE = timedelta(minutes=10)
DEFAULT_BATCH_SIZE = 1000


@dataclass(frozen=True)
class PruneConfig:
    """Pruner knobs."""

    older_than: timedelta = DEFAULT_OLDER_THAN
    batch_size: int = DEFAULT_BATCH_SIZE

    def __post_init__(self) -> None:
        check_duration("older_than", self.older_than)
        check_count("batch_size", self.batch_size, 1, 100_000)


@dataclass(frozen=True)
class PruneResult:
    """What one pass deleted."""

    deleted: int = 0
    batches: int = 0
    seconds: float = 0.0
    # Partitioned mode: ranges of old schedules dropped whole before the batches, and the
    # schedules they held (with their history).
    partitions_dropped: int = 0
    schedules_dropped: int = 0

    @property
    def rate(self) -> float:
        """Schedules deleted per second."""
        return self.deleted / self.seconds if self.seconds > 0 else 0.0


class Pruner:
    """One pruning pass at a time; see the module docstring for its promises."""

    def __init__(self, app: HasCore, config: PruneConfig | None = None) -> None:
        self.core = app.core
        self.config = config or PruneConfig()
        self._loop = Loop("prune", log, metrics.PRUNE_FAILED_PASSES)

    def stop(self) -> None:
        """Ask the loop to stop after the batch under way."""
        self._loop.stop()

    def run_once(self) -> PruneResult:
        """Delete batch after batch until one comes back short (or :meth:`stop`)."""
        started, deleted, batches = time.monotonic(), 0, 0
        behind = partition_maintenance.drop_behind(self.core.engine, self.config.older_than)
        for within in [None] if behind.spans is None else behind.spans:
            while True:
                with self.core.engine.begin() as conn:
                    n = store.prune_finished(
                        conn, self.config.older_than, self.config.batch_size, within
                    )
                metrics.PRUNED.inc(n)
                deleted, batches = deleted + n, batches + 1
                if n < self.config.batch_size or self._loop.stopping:
                    break
            if self._loop.stopping:
                break
        result = PruneResult(
            deleted,
            batches,
            time.monotonic() - started,
            len(behind.dropped),
            behind.schedules_dropped,
        )
        if deleted:
            log.info("pruned %d finished schedules in %d batches", deleted, batches)
        with self.core.engine.begin() as conn:
            store.prune_rate_counts(conn, RATE_COUNTS_IDLE)
        return result

    def run(self, every: timedelta, report: Callable[[PruneResult], None] | None = None) -> None:
        """A pass every ``every`` until :meth:`stop` (see :mod:`duejobs.services.loop`)."""
        self._loop.run_forever(self.run_once, lambda _: every, every, every, report=report)
