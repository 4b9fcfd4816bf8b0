"""The long-running services and their one-pass forms: ``scheduler``, ``reconcile``,
``stats``, ``prune`` (the worker's command is :mod:`duejobs.cli.worker`)."""

from __future__ import annotations

import dataclasses
import json
import logging
import signal
import threading
from collections.abc import Callable
from datetime import timedelta
from typing import Protocol, TypeVar

import click

from duejobs.app.application import App
from duejobs.cli.base import (
    DURATION,
    POSITIVE,
    _app,
    _checked,
    _fail,
    _operate,
    _operations,
    duration_option,
    load_app,
    ready_to_serve,
    say_serving,
    services,
    sync_declared,
)
from duejobs.cli.group import main
from duejobs.errors import DuejobsError, describe, outage
from duejobs.redis_urls import redis_failures
from duejobs.scheduler.loop import Scheduler, SchedulerConfig
from duejobs.services.partition_maintenance import EVERY as PARTITIONS_EVERY
from duejobs.services.partition_maintenance import PartitionMaintenance
from duejobs.services.pruner import PruneConfig, Pruner, PruneResult
from duejobs.services.reconciler import ReconcileConfig, Reconciler, ReconcileResult
from duejobs.services.stats import GaugeRefresh
from duejobs.services.stats import collect as collect_stats
from duejobs.services.stats import render as render_stats
from duejobs.store import dbapi
from duejobs.timespec import spell_duration

# The services' defaults, which the flags show and take: stated once, in the configs.
_SCHEDULER, _RECONCILE, _PRUNE = SchedulerConfig(), ReconcileConfig(), PruneConfig()
R = TypeVar("R")
R_co = TypeVar("R_co", covariant=True)


class _Pass(Protocol[R_co]):
    """A service the CLI runs once or on a cadence (the reconciler, the pruner)."""

    def run_once(self) -> R_co: ...

    def run(self, every: timedelta, report: Callable[[R_co], None] | None = None) -> None: ...

    def stop(self) -> None: ...


def _stop_on_signals(stop: Callable[[], None]) -> None:
    """SIGTERM and SIGINT ask a loop to stop after the pass under way."""
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop())


def _once_or_every(service: _Pass[R], every: timedelta | None, report: Callable[[R], None]) -> None:
    """One pass, or a pass every ``every`` until SIGTERM/SIGINT."""
    if every is None:
        report(service.run_once())
        return
    _stop_on_signals(service.stop)
    service.run(every, report=report)


@main.command()
@click.option("--app", "app_ref", help="MODULE:APP whose queue to use (default: App()).")
@duration_option(
    "--window",
    _SCHEDULER.window,
    "How far ahead to push.",
    zero_ok=True,
)
@click.option(
    "--batch-size", default=_SCHEDULER.batch_size, show_default=True, help="Rows per claim."
)
@duration_option(
    "--poll-interval",
    _SCHEDULER.poll_interval,
    "From one pass's start to the next's.",
)
@click.option(
    "--concurrency",
    default=_SCHEDULER.concurrency,
    show_default=True,
    help="Parallel claim loops.",
)
@_operations
@click.pass_context
def scheduler(
    ctx: click.Context,
    app_ref: str | None,
    window: timedelta,
    batch_size: int,
    poll_interval: timedelta,
    concurrency: int,
    log_level: str,
    log_format: str,
    metrics_port: int | None,
) -> None:
    """Run the windowed scheduler until SIGTERM/SIGINT (then finish the batch and exit 0)."""
    _operate(log_level, log_format, metrics_port)
    with services(ctx.obj["data_dir"]):
        app = load_app(app_ref) if app_ref else App()
        ready_to_serve(app)
        sync_declared(app)
        config = _checked(
            lambda: SchedulerConfig(
                window=window,
                batch_size=batch_size,
                poll_interval=poll_interval,
                concurrency=concurrency,
            )
        )
        try:
            loop = Scheduler(app, config)
        except DuejobsError as exc:
            _fail(exc)
        _stop_on_signals(loop.stop)
        say_serving(app, "scheduler", f"queue {app.queue!r}, window {spell_duration(window)}")
        loop.run()
        loop.close()
        app.close()


def _print_reconciled(result: ReconcileResult, as_json: bool) -> None:
    data = dataclasses.asdict(result)
    if as_json:
        click.echo(json.dumps(data))
        return
    kinds = {
        "repushed": "schedules without a live queue job, pushed again",
        "overdue_repushed": "  of which overdue past the stuck threshold, job hash looked alive",
        "rescued": "running attempts whose worker died, back to scheduled",
        "failed": "running attempts whose worker died, attempts exhausted",
        "orphans_removed": "queue jobs without a current schedule, removed",
        "promoted": "deferred jobs whose time came, moved onto the queue",
    }
    click.echo(f"checked {result.checked} scheduled rows in the window")
    for name, text_ in kinds.items():
        click.echo(f"{data[name]:>8}  {text_}")


@main.command()
@click.option("--every", type=POSITIVE, help="Run a pass this often until SIGTERM/SIGINT: 5s.")
@duration_option(
    "--window",
    _RECONCILE.window,
    "How far ahead to check.",
    zero_ok=True,
)
@click.option(
    "--json",
    "as_json",
    is_flag=True,
    help="Print JSON, one line per pass (without it, --every logs only what a pass fixed).",
)
@duration_option(
    "--stats-every",
    GaugeRefresh.DEFAULT_EVERY,
    "With --metrics-port: refresh the stats gauges at most this often.",
)
@duration_option(
    "--partitions-every",
    PARTITIONS_EVERY,
    "With --every, in partitioned mode: make the coming partitions this often.",
)
@_operations
@click.pass_context
def reconcile(
    ctx: click.Context,
    every: timedelta | None,
    window: timedelta,
    as_json: bool,
    stats_every: timedelta,
    partitions_every: timedelta,
    log_level: str,
    log_format: str,
    metrics_port: int | None,
) -> None:
    """Heal drift between PostgreSQL and Redis: one pass, or one every --every seconds; in
    partitioned mode, the coming partitions made beside it (once, or every --partitions-every).

    With --metrics-port, the figures of `duejobs stats` are exported after the first pass and
    then at most every --stats-every: they count every live row (about 4 s at 5 million live
    schedules), while a pass costs what the window holds."""
    _operate(log_level, log_format, metrics_port)
    with _app(ctx) as app:
        ready_to_serve(app)
        reconciler = Reconciler(app, ReconcileConfig(window=window))
        gauges = GaugeRefresh(lambda: collect_stats(app), stats_every)

        def report(result: ReconcileResult) -> None:
            # In a loop, the reconciler's own log says what a pass fixed (one line) and sums
            # up the passes that fixed nothing; the table is for one pass run by hand.
            if as_json or every is None:
                _print_reconciled(result, as_json)
            if metrics_port is not None:
                try:
                    gauges.maybe_refresh()
                except Exception as exc:
                    outages = (DuejobsError, dbapi.SQLAlchemyError, *redis_failures())
                    if not isinstance(exc, outages):
                        raise
                    # The pass's repairs are done and counted: the figures wait for the next
                    # pass (a replica that is down is its own gauge, duejobs_read_replica_up).
                    said = outage(exc) or describe(exc)
                    logging.getLogger("duejobs.reconcile").warning(
                        "stats gauges not refreshed: %s", said
                    )

        partitions = PartitionMaintenance(app)
        if every is None:
            report(reconciler.run_once())
            partitions.run_once()
            return

        def stop() -> None:
            reconciler.stop()
            partitions.stop()

        _stop_on_signals(stop)  # before the first line: a stop sent once it shows is warm
        say_serving(app, "reconcile", f"a pass every {spell_duration(every)}")
        beside = threading.Thread(
            target=partitions.run, args=(partitions_every,), name="partitions", daemon=True
        )
        beside.start()
        reconciler.run(every, report=report)
        partitions.stop()
        beside.join(timeout=30)


@main.command()
@click.option(
    "--since", type=POSITIVE, default="1h", show_default=True, help="How much history to read."
)
@click.option(
    "--late-after", type=DURATION, default="1m", show_default=True, help="Overdue beyond: late."
)
@click.option("--tenant", help="Only this tenant's figures.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.pass_context
def stats(
    ctx: click.Context, since: timedelta, late_after: timedelta, tenant: str | None, as_json: bool
) -> None:
    """Lag, late jobs, orphans and counts, overall and per tenant / type (--tenant: one
    tenant's)."""
    with _app(ctx) as app:
        scoped = app if tenant is None else app.tenant(tenant)
        figures = collect_stats(scoped, since=since, late_after=late_after)
        click.echo(json.dumps(figures.as_dict()) if as_json else render_stats(figures))


@main.command()
@click.option(
    "--older-than",
    type=POSITIVE,
    required=True,  # deleting is never implied
    help=f"Age of finished schedules to delete, e.g. {spell_duration(_PRUNE.older_than)}.",
)
@click.option(
    "--batch-size",
    type=click.IntRange(min=1),
    default=_PRUNE.batch_size,
    show_default=True,
    help="Rows per transaction.",
)
@click.option("--every", type=POSITIVE, help="Run a pass this often until SIGTERM/SIGINT: 1h.")
@_operations
@click.pass_context
def prune(
    ctx: click.Context,
    older_than: timedelta,
    batch_size: int,
    every: timedelta | None,
    log_level: str,
    log_format: str,
    metrics_port: int | None,
) -> None:
    """Delete finished schedules (and their history) older than --older-than, in batches."""
    config = _checked(lambda: PruneConfig(older_than=older_than, batch_size=batch_size))
    _operate(log_level, log_format, metrics_port)

    def report(result: PruneResult) -> None:
        ranges = (
            f"; dropped {result.partitions_dropped} ranges whole, with "
            f"{result.schedules_dropped} finished schedules"
            if result.partitions_dropped
            else ""
        )
        click.echo(
            f"pruned {result.deleted} finished schedules with their history in "
            f"{result.seconds:.1f} s ({result.rate:,.0f} rows/s){ranges}"
        )

    with _app(ctx) as app:
        pruner = Pruner(app, config)
        _once_or_every(pruner, every, report)
