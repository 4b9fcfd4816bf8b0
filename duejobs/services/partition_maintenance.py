"""Partition maintenance: in partitioned mode, ranges of schedules created ahead and dropped
whole behind.

Partitioned mode is chosen at ``duejobs migrate --partitioned`` (the layout, and why the
tables are partitioned by schedule id, are in :mod:`duejobs.store.partitions`); a plain
schema already in use is moved by :func:`convert`, online. Then:

- **Ahead.** Each pass of :class:`PartitionMaintenance` — a service of its own, run beside
  the reconciler by ``duejobs reconcile`` (every ``EVERY``, 10 minutes, with ``--every``; once
  with a single pass) and by ``duejobs dev`` — makes sure the partitions of the current period
  and of ``ahead`` more exist (default: periods of 7 days, 2 ahead), so a new schedule always
  lands in a partition of its own time. One missed for long (no such pass running) costs no
  insert: such rows land in the ``DEFAULT`` partition, where the pruner's deletes reach them.
- **Behind.** Each pruner pass drops the ranges that hold no live row and nothing that
  finished within ``older_than`` — the schedules with their events, attempts and results, in
  one transaction per range —, deletes their effect-ledger rows in batches (the ledger is not
  partitioned), then deletes the rest as in the plain schema, in batches — except in the
  ranges begun before the horizon, ended less than a period before it, that hold nothing
  live: those are left whole for their drop (:func:`batch_spans`: a pruner run every hour
  would otherwise delete them row by row first). The check is made
  again under the tables' locks, so a retry or a late insert racing with the drop either
  waits and finds no partition (its row goes to the default one), or wins and keeps the
  range.

What it promises: never a dropped live row; never a failed insert for want of a partition;
each creation or drop waits at most ``LOCK_TIMEOUT`` (2 s) for each parent table's lock —
holding it holds up statements on that table for as long as the catalog change takes (a few
milliseconds), and a drop takes the four tables' locks one after the other, so while it waits
for one (a long transaction reading it) statements on those it holds wait too, up to 2 s per
table. A reconciler pass that cannot create a partition fails, to be tried again next
pass (counted in ``duejobs_partition_maintenance_failed_passes_total``, and retried with the
backoff of :mod:`duejobs.services.loop`); a range the pruner cannot drop is
pruned in batches that pass instead (:class:`Behind`), and dropped at a later one.

Rows that waited in the default partition for a period without a partition are moved into it
when it is made. What it does not do: change the period of partitions already made.

Metrics: ``duejobs_partitions_created_total``, ``duejobs_partitions_dropped_total``, and
``duejobs_partitions_ready_ahead_seconds`` (how far past now the last partition reaches, set by
each maintenance pass: below one period, the coming partitions are not being made),
``duejobs_partition_maintenance_failed_passes_total``.
"""

from __future__ import annotations

import contextlib
import logging
import time
import uuid
from collections.abc import Callable, Collection, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import TYPE_CHECKING

from duejobs import store
from duejobs.core import HasCore
from duejobs.errors import PartitioningError
from duejobs.ids import first_id_at
from duejobs.observability import metrics
from duejobs.services.loop import Loop
from duejobs.store import dbapi
from duejobs.store.partitions import Partition, Partitioning

if TYPE_CHECKING:
    from sqlalchemy import Connection, Engine

log = logging.getLogger("duejobs.partitions")

DEFAULT_PERIOD = timedelta(days=7)
DEFAULT_AHEAD = 2
# How often a maintenance loop makes its pass: a small part of any period worth a partition.
EVERY = timedelta(minutes=10)
_EFFECTS_BATCH = 10_000


@dataclass(frozen=True)
class MaintenanceResult:
    """What one maintenance pass made: the partitions created ahead (none in the plain
    schema, or when all were there)."""

    created: list[str] = field(default_factory=list)


class PartitionMaintenance:
    """The partitions ahead, pass after pass (see the module docstring). No knobs: the period
    and how many ahead are the schema's, set at ``duejobs migrate --partitioned``."""

    def __init__(self, app: HasCore) -> None:
        self.core = app.core
        self._loop = Loop("partition maintenance", log, metrics.PARTITION_MAINTENANCE_FAILED)

    def run_once(self) -> MaintenanceResult:
        """Create the partitions missing ahead; what it created."""
        return MaintenanceResult(create_ahead(self.core.engine))

    def run(
        self,
        every: timedelta = EVERY,
        report: Callable[[MaintenanceResult], None] | None = None,
    ) -> None:
        """A pass every ``every`` until :meth:`stop`; a failed one retried sooner, after the
        loop's backoff from a tenth of ``every``."""
        self._loop.run_forever(self.run_once, lambda _: every, every / 10, every, report=report)

    def stop(self) -> None:
        """Ask the loop to stop after the pass under way."""
        self._loop.stop()


def create_ahead(engine: Engine) -> list[str]:
    """Create the partitions missing from the current period to ``ahead`` periods on, each
    period in a transaction of its own; their names. Nothing in the plain schema. A period
    that cannot be created (its locks not granted in time) does not stop the others; the
    first such error is raised once they are done, so the pass counts as failed."""
    with engine.begin() as conn:
        settings = store.partitioning(conn)
        if settings is None:
            return []
        now = store.database_now(conn)
        listed = store.partitions(conn, details=False)
    have = {p.start for p in listed}
    ends = [p.end for p in listed if p.end is not None]
    created: list[str] = []
    failed: Exception | None = None
    for start in settings.coming(now):
        if start in have:
            continue
        try:
            with engine.begin() as conn:
                created.append(store.create_range(conn, settings, start))
            ends.append(start + settings.period)
        except dbapi.SQLAlchemyError as exc:
            log.warning("partition of %s not created: %s", start.isoformat(), exc)
            failed = failed or exc
    metrics.PARTITIONS_READY_AHEAD.set((max(ends) - now).total_seconds() if ends else 0.0)
    if created:
        metrics.PARTITIONS_CREATED.inc(len(created))
        log.info("partitions created: %s", ", ".join(created))
    if failed is not None:
        raise failed
    return created


@dataclass(frozen=True)
class Behind:
    """What :func:`drop_behind` did: the ranges dropped and the schedules they held, those it
    could not drop this pass because their tables were busy, and the spans of ids left to the
    pruner's batches (:func:`batch_spans`; None in the plain schema: every id)."""

    dropped: list[str] = field(default_factory=list)
    schedules_dropped: int = 0
    busy: list[str] = field(default_factory=list)
    spans: list[tuple[uuid.UUID, uuid.UUID]] | None = None


def drop_behind(engine: Engine, older_than: timedelta) -> Behind:
    """Drop each range that holds no live row and nothing finished within ``older_than``,
    then delete the effect-ledger rows of the ranges dropped (and of any dropped before, below
    the oldest range kept) in batches. A range whose locks are not granted in time is left
    for the next pass (named in ``busy``), and the others go on. Nothing in the plain
    schema."""
    with engine.begin() as conn:
        settings = store.partitioning(conn)
        if settings is None:
            return Behind()
        horizon = store.database_now(conn) - older_than
        listed = store.partitions(conn)
    candidates = [p for p in listed if p.droppable_by(horizon)]
    dropped: list[Partition] = []
    busy: list[str] = []
    held = 0
    for partition in candidates:
        with engine.connect() as conn:
            rows = store.partition_rows(conn, partition)
        try:
            with engine.begin() as conn:
                if store.drop_partition(conn, partition, older_than):
                    dropped.append(partition)
                    held += rows
        except dbapi.OperationalError as exc:
            if not store.is_lock_conflict(exc):
                raise
            busy.append(partition.name)
            log.warning("%s not dropped this pass: its tables are busy", partition.name)
    with engine.begin() as conn:
        kept = [p.start for p in store.partitions(conn, details=False) if p.start is not None]
    spans: list[tuple[datetime | None, datetime]] = [
        (p.start, p.end) for p in dropped if p.start and p.end
    ]
    if kept:
        spans.append((None, min(kept)))
    for low, high in spans:
        while True:
            with engine.begin() as conn:
                n = store.delete_orphan_effects(conn, low, high, _EFFECTS_BATCH)
            if n < _EFFECTS_BATCH:
                break
    if dropped:
        metrics.PARTITIONS_DROPPED.inc(len(dropped))
        names = ", ".join(p.name for p in dropped)
        log.info("partitions dropped: %s (%d schedules with their history)", names, held)
    left = batch_spans(listed, settings.period, horizon, busy)
    return Behind([p.name for p in dropped], held, busy, left)


_LAST_ID = uuid.UUID(int=(1 << 128) - 1)


def batch_spans(
    listed: Sequence[Partition], period: timedelta, horizon: datetime, busy: Collection[str]
) -> list[tuple[uuid.UUID, uuid.UUID]]:
    """The spans of ids (lowest, highest, both included) the pruner's batches delete in:
    every id but those of the ranges a drop will take soon. A range begun before the
    ``horizon`` (now - ``older_than``), ended less than a ``period`` before it, holding no
    live row, is dropped whole once its last schedule finished before the horizon
    (:func:`drop_behind`), and deleting it batch by batch meanwhile would cost what the drop
    saves. So a finished schedule stays at most two periods past ``older_than``. The batches
    delete in every other range: one a live row keeps (for months, maybe), one still kept
    from its drop a period after its end (a schedule of it finished late, or retried), one
    whose tables were ``busy`` this pass, and the default partition's ids."""
    waiting = [
        p
        for p in listed
        if p.start is not None
        and p.end is not None
        and p.start <= horizon < p.end + period
        and not p.live
        and p.name not in busy
    ]
    spans, low = [], 0
    for p in waiting:  # oldest first
        assert p.start is not None and p.end is not None
        start, end = first_id_at(p.start).int, first_id_at(p.end).int
        if start > low:
            spans.append((uuid.UUID(int=low), uuid.UUID(int=start - 1)))
        low = end
    return [*spans, (uuid.UUID(int=low), _LAST_ID)]


def describe(engine: Engine) -> tuple[Partitioning | None, list[Partition]]:
    """The mode's settings and every partition (``duejobs partitions``)."""
    with engine.begin() as conn:
        settings = store.partitioning(conn)
        return settings, ([] if settings is None else store.partitions(conn))


# An arbitrary, fixed advisory-lock key: one conversion at a time per database.
_CONVERT_LOCK = 0x6475656A6F6270  # "duejobp"
SWAP_ATTEMPTS = 30


def convert(
    engine: Engine,
    settings: Partitioning,
    *,
    batch_size: int = 10_000,
    report: Callable[[str], None] = log.info,
) -> int:
    """Move a filled plain schema into partitioned mode while it is in use; the rows copied.

    1. The partitioned tables are built empty in a staging schema (``<schema>_partitioning``)
       by the same migrations, with ranges from the oldest schedule's period on.
    2. Triggers on the four source tables make every later write the same write there (the
       tables locked at once, waiting at most 100 ms for each; tried again as the swap is).
    3. The rows there when the triggers began are copied in batches of ``batch_size``, each
       its own short transaction, up to the greatest key there was then (later rows the
       triggers wrote); a row the triggers wrote already is left alone.
    4. One short transaction locks the source tables (waiting at most 100 ms for each; tried
       again up to ``SWAP_ATTEMPTS`` times), drops them and moves the staging tables in.

    Application writes go on throughout (each pays for its mirrored write meanwhile); only
    the last step holds them up, for as long as it takes to move catalog entries. Stopped
    midway, the source tables are as they were but for the triggers: running it again starts
    over, and :func:`abort_conversion` (``duejobs partitions --abort``) removes them and the
    staging schema. One conversion at a time (an advisory lock)."""
    schema = _schema_of(engine)
    staging = store.staging_schema(schema)
    with _alone(engine, "another conversion to partitioned mode is running"):
        return _convert(engine, schema, staging, settings, batch_size, report)


def abort_conversion(engine: Engine) -> bool:
    """Remove what a conversion stopped from outside (SIGKILL, a lost connection: one that
    fails in its own process cleans up after itself) left behind — the mirroring triggers,
    which make every write pay for a copy, and the staging schema; whether there was any.
    Refused while a conversion runs (:class:`PartitioningError`). The source tables are as
    they were; converting again starts over."""
    staging = store.staging_schema(_schema_of(engine))
    with _alone(engine, "a conversion to partitioned mode is running: stop it first"):
        with engine.connect() as conn:
            left = store.conversion_left(conn, staging)
        _remove_staging(engine, staging, lambda _: None)
    return left


def _schema_of(engine: Engine) -> str:
    schema: str = engine.get_execution_options().get(store.SCHEMA_OPTION, "public")
    return schema


@contextlib.contextmanager
def _alone(engine: Engine, refusal: str) -> Iterator[None]:
    """The conversion's advisory lock held for the block: one conversion, or removal of one,
    at a time (``refusal`` when another holds it). The lock is the session's, held across
    the conversion's many transactions: refused through a pooler, which may hand that
    session to anyone between two of them (run the conversion with a URL to PostgreSQL
    itself)."""
    with engine.connect() as holder:
        if store.behind_pooler(holder.connection.dbapi_connection):
            raise PartitioningError(
                "the conversion holds a lock for its whole session, which a connection pooler "
                "may hand to another client: run it with a database URL that reaches "
                "PostgreSQL itself"
            )
        if not store.try_session_lock(holder, _CONVERT_LOCK):
            raise PartitioningError(refusal)
        try:
            yield
        finally:
            store.session_unlock(holder, _CONVERT_LOCK)


def _convert(
    engine: Engine,
    schema: str,
    staging: str,
    settings: Partitioning,
    batch_size: int,
    report: Callable[[str], None],
) -> int:
    with engine.begin() as conn:
        if store.partitioning(conn) is not None:
            return 0
    _remove_staging(engine, staging, report)  # a conversion stopped midway starts over
    from duejobs.store.migrate import upgrade  # Alembic, loaded only by the schema's changes

    staged = engine.execution_options(**{store.SCHEMA_OPTION: staging})
    upgrade(staged)
    with staged.begin() as conn:
        store.use_schema(conn, staging)
        now = store.database_now(conn)
        store.make_partitioned(conn, settings, now)
        store.link_recurring(conn, schema)
        have = {p.start for p in store.partitions(conn, details=False)}
    with engine.connect() as source:
        oldest = store.oldest_stamped(source)
    for start in settings.periods(oldest or now, now):  # the rows' ranges, one transaction each
        if start not in have:
            with staged.begin() as conn:
                store.create_range(conn, settings, start)
    try:
        _in_turns(engine, "mirror", lambda conn: store.mirror(conn, staging), report)
        report(f"partitioned tables built in {staging}; source writes mirrored there")
        copied = _copy(engine, staging, batch_size, report)
        _in_turns(engine, "swap", lambda conn: store.swap(conn, staging), report)
    except BaseException:
        # The source tables stay as they were; the writes stop paying for a mirror.
        _remove_staging(engine, staging, report)
        raise
    report(f"{schema}: partitioned mode")
    return copied


def _remove_staging(engine: Engine, staging: str, report: Callable[[str], None]) -> None:
    """The mirroring triggers removed (tried again while the tables are busy), then the
    staging schema dropped (no source table locked)."""
    _in_turns(engine, "unmirror", store.unmirror, report)
    with engine.begin() as conn:
        store.drop_schema(conn, staging)


def _copy(engine: Engine, staging: str, batch_size: int, report: Callable[[str], None]) -> int:
    copied = 0
    for table in store.PARTITIONED:
        after, rows, batches = None, 0, 0
        with engine.connect() as conn:
            upto = store.last_key(conn, table)  # later rows: written since, mirrored already
        while upto is not None:
            with engine.begin() as conn:
                batch = store.copy_batch(conn, staging, table, after, upto, batch_size)
            if batch is None:
                break
            after, n = batch
            rows, batches = rows + n, batches + 1
        copied += rows
        report(f"{table}: copied {rows:,} rows in {batches:,} batches ({copied:,} rows so far)")
    return copied


def _in_turns(
    engine: Engine, what: str, step: Callable[[Connection], None], report: Callable[[str], None]
) -> None:
    """``step`` in a transaction of its own, again while it finds the source tables busy: it
    waits at most 100 ms for each of its six locks, under PostgreSQL's 1 s deadlock check, so a
    writer it holds up is never the transaction that check ends (up to SWAP_ATTEMPTS). When
    an autovacuum worker is what holds the tables, the next attempt first waits it out in a
    mode no write or read conflicts with (:func:`duejobs.store.wait_out_autovacuum`): on a
    filled table that worker can run for minutes, longer than every brief attempt together."""
    vacuumed: list[str] = []
    for attempt in range(1, SWAP_ATTEMPTS + 1):
        try:
            with engine.begin() as conn:
                if vacuumed:
                    store.wait_out_autovacuum(conn, vacuumed)
                step(conn)
            return
        except dbapi.OperationalError as exc:
            if not store.is_lock_conflict(exc) or attempt == SWAP_ATTEMPTS:
                raise
            with engine.connect() as conn:
                vacuumed = store.autovacuumed(conn)
            why = f"; autovacuum holds {', '.join(vacuumed)}: waiting it out" if vacuumed else ""
            report(f"{what}: the tables are busy (attempt {attempt}){why}; trying again")
            time.sleep(0.1 if vacuumed else min(attempt, 5))
