"""The long-running services and their one-pass forms: ``scheduler``, ``worker``,
``reconcile``, ``stats``, ``prune``."""

from __future__ import annotations

import dataclasses
import json
import logging
import signal
import sys
from collections.abc import Callable
from datetime import timedelta
from typing import Any, Protocol, TypeVar

import click
from redis.exceptions import RedisError
from sqlalchemy.exc import SQLAlchemyError

from duejobs.app.application import App
from duejobs.cli.base import (
    _PRUNE,
    _RECONCILE,
    _SCHEDULER,
    DURATION,
    POSITIVE,
    CpuList,
    F,
    _app,
    _checked,
    _fail,
    _operate,
    _operations,
    duration_option,
    load_app,
    services,
    sync_declared,
)
from duejobs.cli.group import main
from duejobs.errors import ConfigurationError, DuejobsError, describe, outage
from duejobs.observability.stats import GaugeRefresh
from duejobs.observability.stats import collect as collect_stats
from duejobs.observability.stats import render as render_stats
from duejobs.scheduler.loop import Scheduler, SchedulerConfig
from duejobs.services.pruner import PruneConfig, Pruner, PruneResult
from duejobs.services.reconciler import ReconcileConfig, Reconciler, ReconcileResult
from duejobs.timespec import spell_duration
from duejobs.validation import check_queue
from duejobs.worker import WorkerConfig, build_worker
from duejobs.worker.supervisor import Supervisor, allowed_cpus, pin_to_cpu

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
    "Pause between passes.",
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
        click.echo(f"duejobs scheduler: queue {app.queue!r}, window {window}", err=True)
        loop.run()
        loop.close()
        app.close()


def _flag(knob: dataclasses.Field[Any]) -> str:
    return "--" + knob.name.replace("_", "-")


def _worker_knobs(command: F) -> F:
    """One flag per field of :class:`WorkerConfig`, its default, bounds and help taken from
    the field (a duration as the CLI spells durations, a switch as ``--x/--no-x``)."""
    for knob in reversed(dataclasses.fields(WorkerConfig)):
        flag, about, default = _flag(knob), knob.metadata["help"], knob.default
        if isinstance(default, bool):
            negative = f"--no-{flag.removeprefix('--')}"
            option = click.option(
                f"{flag}/{negative}", default=default, show_default=True, help=about
            )
        elif isinstance(default, timedelta):
            option = duration_option(
                flag, default, about, zero_ok=knob.metadata.get("zero_ok", False)
            )
        else:
            bounds = click.IntRange(knob.metadata["low"], knob.metadata["high"])
            option = click.option(flag, type=bounds, default=default, show_default=True, help=about)
        command = option(command)
    return command


def _knob_flags(config: WorkerConfig) -> list[str]:
    """The flags that give a worker started by the supervisor this ``config``."""
    flags = []
    for knob in dataclasses.fields(config):
        value = getattr(config, knob.name)
        if isinstance(value, bool):
            flags.append(_flag(knob) if value else f"--no-{_flag(knob).removeprefix('--')}")
        elif isinstance(value, timedelta):
            flags.append(f"{_flag(knob)}={spell_duration(value)}")
        else:
            flags.append(f"{_flag(knob)}={value}")
    return flags


@main.command()
@click.option("--app", "app_ref", required=True, help="MODULE:APP with the handlers.")
@click.option("--burst", is_flag=True, help="Exit once the queue is empty.")
@click.option(
    "--queue",
    "queues",
    multiple=True,
    help="RQ queue to take jobs from; repeat for several, in priority order (default: the App's).",
)
@click.option("--name", help="Worker name (default: host:pid).")
@_worker_knobs
@click.option(
    "--cpus",
    type=CpuList(),
    default=None,
    metavar="LIST",
    help="Pin each worker process to one of these CPUs (e.g. 1, or 0,1: the i-th process of "
    "--processes takes the i-th, round robin; a lone worker the first). Its slots' threads "
    "then wake each other on one CPU, far cheaper than across CPUs on virtual machines. "
    "Default: not pinned.",
)
@click.option(
    "--processes",
    type=click.IntRange(1, 256),
    default=1,
    show_default=True,
    help="Worker processes under one supervisor that starts again any that exits; each "
    "serves metrics on --metrics-port plus its index.",
)
@_operations
@click.pass_context
def worker(
    ctx: click.Context,
    /,
    app_ref: str,
    burst: bool,
    queues: tuple[str, ...],
    name: str | None,
    cpus: tuple[int, ...] | None,
    processes: int,
    log_level: str,
    log_format: str,
    metrics_port: int | None,
    **knobs: Any,
) -> None:
    """Run an RQ worker for the App's handlers. SIGTERM/SIGINT: take no more jobs, finish
    the running ones, then exit; a second one ends the worker at once."""
    if cpus:
        try:
            allowed = allowed_cpus()
        except DuejobsError as exc:
            raise click.BadParameter(str(exc), param_hint="--cpus") from exc
        if not set(cpus) <= allowed:
            refused = sorted(set(cpus) - allowed)
            raise click.BadParameter(
                f"CPUs {refused} are not ones this process may run on ({sorted(allowed)})",
                param_hint="--cpus",
            )
    _operate(log_level, log_format, metrics_port if processes == 1 else None)
    config = _checked(lambda: WorkerConfig(**knobs))
    if processes > 1:
        shared = ["worker", "--app", app_ref, *(f"--queue={q}" for q in queues)]
        shared += [*_knob_flags(config), f"--log-level={log_level}"]
        shared += [f"--log-format={log_format}", *(["--burst"] if burst else [])]

        def child(index: int, starts: int) -> list[str]:
            # RQ refuses a name still registered by a worker that ended without deregistering
            # (killed, or ended for its supervisor): each start gets a name of its own.
            named = f"{name}-{index}" + (f".{starts}" if starts > 1 else "")
            return [
                *shared,
                *([f"--name={named}"] if name else []),
                *([f"--metrics-port={metrics_port + index}"] if metrics_port is not None else []),
                *([f"--cpus={cpus[index % len(cpus)]}"] if cpus else []),
            ]

        with services(ctx.obj["data_dir"]):
            sys.exit(Supervisor(processes, child, burst=burst).run())
    with services(ctx.obj["data_dir"]):
        if cpus:  # after the embedded servers start (they keep every CPU), before the
            pin_to_cpu(cpus[0])  # worker's threads start (they inherit it)
        app = load_app(app_ref)
        sync_declared(app)
        try:
            worker = build_worker(app, config, [check_queue(q) for q in queues], name=name)
        except ConfigurationError as exc:  # queues on several nodes: bad flags, exit 2
            raise click.BadParameter(str(exc), param_hint="--queue") from exc
        except DuejobsError as exc:
            _fail(exc)
        worker.runtime.warn_if_outcomes_can_be_lost()
        try:
            worker.work(burst=burst)
        except Exception as exc:  # not an outage (those are waited out): a refused password
            click.echo(f"duejobs worker: ended by {describe(exc)}", err=True)
            sys.exit(1)
        finally:
            worker.runtime.close()
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
@_operations
@click.pass_context
def reconcile(
    ctx: click.Context,
    every: timedelta | None,
    window: timedelta,
    as_json: bool,
    stats_every: timedelta,
    log_level: str,
    log_format: str,
    metrics_port: int | None,
) -> None:
    """Heal drift between PostgreSQL and Redis: one pass, or one every --every seconds.

    With --metrics-port, the figures of `duejobs stats` are exported after the first pass and
    then at most every --stats-every: they count every live row (about 4 s at 5 million live
    schedules), while a pass costs what the window holds."""
    _operate(log_level, log_format, metrics_port)
    with _app(ctx) as app:
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
                except (DuejobsError, RedisError, SQLAlchemyError) as exc:
                    # The pass's repairs are done and counted: the figures wait for the next
                    # pass (a replica that is down is its own gauge, duejobs_read_replica_up).
                    said = outage(exc) or describe(exc)
                    logging.getLogger("duejobs.reconcile").warning(
                        "stats gauges not refreshed: %s", said
                    )

        _once_or_every(reconciler, every, report)


@main.command()
@click.option(
    "--since", type=POSITIVE, default="1h", show_default=True, help="How much history to read."
)
@click.option(
    "--late-after", type=DURATION, default="1m", show_default=True, help="Overdue beyond: late."
)
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.pass_context
def stats(ctx: click.Context, since: timedelta, late_after: timedelta, as_json: bool) -> None:
    """Lag, late jobs, orphans and counts, overall and per tenant / type."""
    with _app(ctx) as app:
        figures = collect_stats(app, since=since, late_after=late_after)
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
