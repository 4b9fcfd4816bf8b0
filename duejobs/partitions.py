"""Partition maintenance: in partitioned mode, ranges of schedules created ahead and dropped
whole behind.

Partitioned mode is chosen at ``duejobs migrate --partitioned`` (the layout, and why the
tables are partitioned by schedule id, are in :mod:`duejobs.store.partitions`). Then:

- **Ahead.** Each reconciler pass makes sure the partitions of the current period and of
  ``ahead`` more exist (default: periods of 7 days, 2 ahead), so a new schedule always lands in
  a partition of its own time. One missed for long (no reconciler running) costs no insert:
  such rows land in the ``DEFAULT`` partition, where the pruner's deletes reach them.
- **Behind.** Each pruner pass drops the ranges that hold no live row and nothing that
  finished within ``older_than`` — the schedules with their events, attempts, results and
  effect-ledger rows, in one transaction per range — then deletes the rest as in the plain
  schema, in batches. The check is made again under the partition's lock, so a retry or a late
  insert racing with the drop either waits and finds no partition (its row goes to the
  default one), or wins and keeps the range.

What it promises: never a dropped live row; never a failed insert for want of a partition;
each creation or drop waits at most ``LOCK_TIMEOUT`` (2 s) for its parent table's lock —
taking it holds up statements on that table for as long as the catalog change takes (a few
milliseconds), and a pass that cannot get it fails, to be tried again next pass (counted in
``duejobs_reconciler_failed_passes_total`` / ``duejobs_pruner_failed_passes_total``).

What it does not do: move rows out of the default partition (`duejobs partitions` shows how
many are there), or change the period of partitions already made.

Metrics: ``duejobs_partitions_created_total``, ``duejobs_partitions_dropped_total``, and
``duejobs_partitions_ready_ahead_seconds`` (how far past now the last partition reaches, set by
each reconciler pass: below one period, the coming partitions are not being made).
"""

from __future__ import annotations

import logging
from datetime import datetime, timedelta

from sqlalchemy import Engine

from duejobs import metrics, store
from duejobs.store.partitions import Partition, Partitioning

log = logging.getLogger("duejobs.partitions")

DEFAULT_PERIOD = timedelta(days=7)
DEFAULT_AHEAD = 2


def create_ahead(engine: Engine) -> list[str]:
    """Create the partitions missing from the current period to ``ahead`` periods on; their
    names. Nothing in the plain schema."""
    with engine.begin() as conn:
        settings = store.partitioning(conn)
        if settings is None:
            return []
        now = store.database_now(conn)
        created = store.ensure_ahead(conn, settings, now)
        ends = [p.end for p in store.partitions(conn, details=False) if p.end is not None]
    metrics.PARTITIONS_READY_AHEAD.set((max(ends) - now).total_seconds() if ends else 0.0)
    if created:
        metrics.PARTITIONS_CREATED.inc(len(created))
        log.info("partitions created: %s", ", ".join(created))
    return created


def drop_behind(engine: Engine, older_than: timedelta) -> list[str]:
    """Drop each range that holds no live row and nothing finished within ``older_than``;
    the names of those dropped. Nothing in the plain schema."""
    with engine.begin() as conn:
        if store.partitioning(conn) is None:
            return []
        horizon = store.database_now(conn) - older_than
        candidates = [p for p in store.partitions(conn) if _may_drop(p, horizon)]
    dropped = []
    for partition in candidates:
        with engine.begin() as conn:
            if store.drop_partition(conn, partition, older_than):
                dropped.append(partition.name)
    if dropped:
        metrics.PARTITIONS_DROPPED.inc(len(dropped))
        log.info("partitions dropped: %s", ", ".join(dropped))
    return dropped


def _may_drop(partition: Partition, horizon: datetime) -> bool:
    """Whether a range looks droppable (checked again under its lock): made before the
    horizon, no live row, nothing finished since."""
    if partition.end is None or partition.live or partition.end > horizon:
        return False
    return partition.last_finished is None or partition.last_finished < horizon


def describe(engine: Engine) -> tuple[Partitioning | None, list[Partition]]:
    """The mode's settings and every partition (``duejobs partitions``)."""
    with engine.begin() as conn:
        settings = store.partitioning(conn)
        return settings, ([] if settings is None else store.partitions(conn))
