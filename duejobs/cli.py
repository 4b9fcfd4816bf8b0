"""The ``duejobs`` command line.

Without ``DUEJOBS_DATABASE_URL`` / ``DUEJOBS_REDIS_URL`` every command uses the embedded
PostgreSQL and Redis kept under ``./.duejobs`` (``--data-dir``), starting them if needed and
saying so in one line. Bad input exits with status 2 and a message naming the problem;
an unreachable service exits with status 1.
"""

from __future__ import annotations

import dataclasses
import importlib
import json
import os
import signal
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict
from datetime import datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn, TypeVar

import click

from duejobs import logs, metrics
from duejobs.app import UNSET, App, Unset
from duejobs.config import DATABASE_ENV, REDIS_ENV
from duejobs.embedded import DEFAULT_DATA_DIR, EmbeddedServices, start_embedded
from duejobs.errors import DuejobsError
from duejobs.models import DstGap, DstOverlap, Event, Misfire, Recurring, Schedule
from duejobs.prune import PruneConfig, Pruner, PruneResult
from duejobs.reconcile import ReconcileConfig, Reconciler, ReconcileResult
from duejobs.scheduler import Scheduler, SchedulerConfig
from duejobs.stats import collect as collect_stats
from duejobs.stats import render as render_stats
from duejobs.timespec import parse_duration, spell_duration
from duejobs.validation import check_queue
from duejobs.worker import EXIT_WEDGED, DuejobsWorker, Runtime, WorkerConfig

F = TypeVar("F", bound=Callable[..., Any])


@contextmanager
def services(data_dir: Path) -> Iterator[EmbeddedServices | None]:
    """Use the configured URLs, or start/join the embedded servers for this command.

    The URLs are exported to the environment so that an ``App()`` built by user code (and
    any child process) finds the same servers.
    """
    if os.environ.get(DATABASE_ENV) and os.environ.get(REDIS_ENV):
        yield None
        return
    try:
        embedded = start_embedded(data_dir)
    except DuejobsError as exc:
        _fail(exc)
    click.echo(embedded.describe(), err=True)
    os.environ.setdefault(DATABASE_ENV, embedded.database_url)
    os.environ.setdefault(REDIS_ENV, embedded.redis_url)
    try:
        yield embedded
    finally:
        embedded.stop()


if TYPE_CHECKING:  # generic in click's stubs since 8.2; a plain class before at run time
    _ParamType = click.ParamType[Any]
else:
    _ParamType = click.ParamType


class Duration(_ParamType):
    """A duration flag: ``250ms``, ``45s``, ``30m``, ``1h30m``, ``2d`` or plain seconds — the
    one syntax of every duration the CLI takes."""

    name = "duration"

    def __init__(self, *, positive: bool = False) -> None:
        self.positive = positive

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if isinstance(value, timedelta):
            return value
        try:
            duration = parse_duration(str(value))
        except DuejobsError as exc:
            self.fail(str(exc).removeprefix("duration: "), param, ctx)
        if self.positive and duration <= timedelta(0):
            self.fail(f"must be greater than zero, got {value!r}", param, ctx)
        return duration


# The services' defaults, which the flags show and take: stated once, in the configs.
_SCHEDULER, _WORKER, _RECONCILE, _PRUNE = (
    SchedulerConfig(),
    WorkerConfig(),
    ReconcileConfig(),
    PruneConfig(),
)
DURATION = Duration()
POSITIVE = Duration(positive=True)
LOG_LEVELS = click.Choice(["debug", "info", "warning", "error", "critical"], case_sensitive=False)


class _Cli(click.Group):
    """Bad flags are one line on stderr and exit status 2 (no usage block to scroll past)."""

    def main(self, *args: Any, **kwargs: Any) -> Any:
        kwargs["standalone_mode"] = False
        try:
            code = super().main(*args, **kwargs)
        except click.UsageError as exc:
            click.echo(f"error: {exc.format_message()}", err=True)
            sys.exit(2)
        except click.Abort:
            click.echo("aborted", err=True)
            sys.exit(1)
        except click.ClickException as exc:
            click.echo(f"error: {exc.format_message()}", err=True)
            sys.exit(exc.exit_code)
        sys.exit(code if isinstance(code, int) else 0)


C = TypeVar("C")


def _checked(make: Callable[[], C]) -> C:
    """A service's config built from flags; its refusal names the flag (each config's
    messages start with the field's name)."""
    try:
        return make()
    except DuejobsError as exc:
        field = str(exc).split(" ", 1)[0]
        raise click.BadParameter(str(exc), param_hint=f"--{field.replace('_', '-')}") from exc


def _fail(exc: Exception) -> NoReturn:
    click.echo(f"error: {exc}", err=True)
    sys.exit(2 if isinstance(exc, ValueError) else 1)


@contextmanager
def _app(ctx: click.Context, migrate: bool = False) -> Iterator[App]:
    data_dir: Path = ctx.obj["data_dir"]
    try:
        with services(data_dir):
            app = App()
            try:
                if migrate:
                    app.migrate()
                yield app
            finally:
                app.close()
    except DuejobsError as exc:
        _fail(exc)


def _schedule_dict(s: Schedule) -> dict[str, Any]:
    return {
        "id": str(s.id),
        "tenant": s.tenant,
        "type": s.type,
        "key": s.key,
        "status": s.status.value,
        "version": s.version,
        "run_at": s.run_at.isoformat(),
        "timezone": s.timezone,
        "run_at_local": s.run_at_local.isoformat(),
        "attempts": s.attempts,
        "queue_job_id": s.queue_job_id,
        "last_error": s.last_error,
        "payload": s.payload,
        "created_at": s.created_at.isoformat(),
    }


def _event_dict(e: Event) -> dict[str, Any]:
    return {"at": e.at.isoformat(), "kind": e.kind.value, "version": e.version, **e.detail}


def _print_schedule(s: Schedule, as_json: bool) -> None:
    data = _schedule_dict(s)
    if as_json:
        click.echo(json.dumps(data, default=str))
        return
    for name, value in data.items():
        click.echo(f"{name:>13}  {json.dumps(value) if name == 'payload' else value}")


def _when_options(func: F) -> F:
    func = click.option("--tz", "timezone", help="IANA zone; --at without an offset is local.")(
        func
    )
    func = click.option("--at", "at", help="ISO 8601 time, e.g. 2026-10-30T09:00:00-03:00.")(func)
    return click.option(
        "--in", "delay", type=DURATION, help="Delay from the database clock: 45s, 30m, 1h30m."
    )(func)


def _when(delay: timedelta | None, at: str | None) -> dict[str, Any]:
    if at is not None:
        try:
            return {"run_at": datetime.fromisoformat(at)}
        except ValueError as exc:
            raise click.BadParameter(f"not an ISO 8601 time: {at!r}", param_hint="--at") from exc
    if delay is not None:
        return {"delay": delay}
    return {}


@click.group(cls=_Cli)
@click.option(
    "--data-dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=DEFAULT_DATA_DIR,
    show_default=True,
    help="Where the embedded servers keep their data when no URLs are set.",
)
@click.pass_context
def main(ctx: click.Context, data_dir: Path) -> None:
    """duejobs: durable delayed and scheduled jobs on PostgreSQL and RQ."""
    ctx.ensure_object(dict)
    ctx.obj["data_dir"] = data_dir


@main.command()
@click.pass_context
def migrate(ctx: click.Context) -> None:
    """Create or upgrade the schema (idempotent, safe to run concurrently)."""
    with _app(ctx) as app:
        before, after = app.migrate()
        if before == after:
            click.echo(f"schema already at revision {after}")
        else:
            click.echo(f"schema upgraded from {before or 'nothing'} to {after}")


@main.command()
@click.argument("job_type")
@_when_options
@click.option("--payload", default="{}", show_default=True, help="JSON payload (ids, not copies).")
@click.option("--key", help="Business key: scheduling a live key again returns the same schedule.")
@click.option("--tenant", default=None, help="Tenant name (default: 'default').")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.pass_context
def schedule(
    ctx: click.Context,
    job_type: str,
    delay: timedelta | None,
    at: str | None,
    timezone: str | None,
    payload: str,
    key: str | None,
    tenant: str | None,
    as_json: bool,
) -> None:
    """Schedule JOB_TYPE --in DURATION or --at TIME."""
    try:
        data = json.loads(payload)
    except ValueError as exc:
        raise click.BadParameter(f"not JSON: {exc}", param_hint="--payload") from exc
    with _app(ctx) as app:
        s = app.schedule(
            job_type, data, timezone=timezone, key=key, tenant=tenant, **_when(delay, at)
        )
        _print_schedule(s, as_json)


@main.command()
@click.argument("schedule_id")
@click.pass_context
def cancel(ctx: click.Context, schedule_id: str) -> None:
    """Cancel a schedule (exit 1 if it was not scheduled or running)."""
    with _app(ctx) as app:
        cancelled = app.cancel(schedule_id)
        click.echo("cancelled" if cancelled else "not cancelled: not scheduled or running")
        sys.exit(0 if cancelled else 1)


@main.command()
@click.argument("schedule_id")
@_when_options
@click.option("--expected-version", type=int, help="Refuse if the schedule moved meanwhile.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.pass_context
def reschedule(
    ctx: click.Context,
    schedule_id: str,
    delay: timedelta | None,
    at: str | None,
    timezone: str | None,
    expected_version: int | None,
    as_json: bool,
) -> None:
    """Move a schedule --in DURATION or --at TIME (its version goes up by one)."""
    with _app(ctx) as app:
        s = app.reschedule(
            schedule_id,
            timezone=timezone,
            expected_version=expected_version,
            **_when(delay, at),
        )
        _print_schedule(s, as_json)


@main.command()
@click.argument("schedule_id")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.pass_context
def show(ctx: click.Context, schedule_id: str, as_json: bool) -> None:
    """Show a schedule and its history."""
    with _app(ctx) as app:
        s = app.get(schedule_id)
        events = app.history(schedule_id) if s else []
        if s is None:
            click.echo(f"error: no schedule {schedule_id}", err=True)
            sys.exit(1)
        if as_json:
            out = {**_schedule_dict(s), "history": [_event_dict(e) for e in events]}
            click.echo(json.dumps(out, default=str))
            return
        _print_schedule(s, as_json=False)
        click.echo("history:")
        for e in events:
            detail = " ".join(f"{k}={v}" for k, v in e.detail.items() if v is not None)
            click.echo(f"  {e.at.isoformat()}  v{e.version}  {e.kind.value:<11} {detail}")


def load_app(reference: str) -> App:
    """The App named by ``MODULE:ATTRIBUTE`` (the current directory is importable)."""
    module_name, _, attribute = reference.partition(":")
    if not module_name or not attribute:
        raise click.BadParameter(f"expected MODULE:APP, got {reference!r}", param_hint="--app")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise click.BadParameter(
            f"cannot import {module_name!r}: {exc}", param_hint="--app"
        ) from exc
    app = getattr(module, attribute, None)
    if not isinstance(app, App):
        raise click.BadParameter(
            f"{reference!r} is not a duejobs.App (got {type(app).__name__})", param_hint="--app"
        )
    return app


def _operations(func: F) -> F:
    """Options every long-running command shares: logs and metrics."""
    func = click.option("--metrics-port", type=int, help="Serve Prometheus /metrics here.")(func)
    func = click.option(
        "--log-format", type=click.Choice(["text", "json"]), default="text", show_default=True
    )(func)
    return click.option("--log-level", type=LOG_LEVELS, default="info", show_default=True)(func)


def _operate(log_level: str, log_format: str, metrics_port: int | None) -> None:
    logs.configure(log_level, log_format)
    if metrics_port is not None:
        metrics.serve(metrics_port)


@main.command()
@click.option("--app", "app_ref", help="MODULE:APP whose queue to use (default: App()).")
@click.option(
    "--window",
    type=DURATION,
    default=spell_duration(_SCHEDULER.window),
    show_default=True,
    help="How far ahead to push.",
)
@click.option(
    "--batch-size", default=_SCHEDULER.batch_size, show_default=True, help="Rows per claim."
)
@click.option(
    "--poll-interval",
    type=POSITIVE,
    default=spell_duration(_SCHEDULER.poll_interval),
    show_default=True,
    help="Pause between passes.",
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
        try:
            config = SchedulerConfig(
                window=window,
                batch_size=batch_size,
                poll_interval=poll_interval,
                concurrency=concurrency,
            )
            loop = Scheduler(app, config)
        except DuejobsError as exc:
            _fail(exc)
        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, lambda *_: loop.stop())
        click.echo(f"duejobs scheduler: queue {app.queue!r}, window {window}", err=True)
        loop.run()
        loop.close()
        app.close()


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
@click.option(
    "--lease",
    type=POSITIVE,
    default=spell_duration(_WORKER.lease),
    show_default=True,
    help="A running job's lease.",
)
@click.option(
    "--heartbeat",
    type=POSITIVE,
    default=spell_duration(_WORKER.heartbeat),
    show_default=True,
    help="Between renewals (at most half the lease).",
)
@click.option(
    "--timeout-grace",
    type=POSITIVE,
    default=spell_duration(_WORKER.timeout_grace),
    show_default=True,
    help="How long a handler past its timeout may take to return before the worker exits "
    f"with status {EXIT_WEDGED} for its supervisor to restart it.",
)
@_operations
@click.pass_context
def worker(
    ctx: click.Context,
    app_ref: str,
    burst: bool,
    queues: tuple[str, ...],
    name: str | None,
    lease: timedelta,
    heartbeat: timedelta,
    timeout_grace: timedelta,
    log_level: str,
    log_format: str,
    metrics_port: int | None,
) -> None:
    """Run an RQ worker for the App's handlers. SIGTERM/SIGINT: finish the job, then exit."""
    _operate(log_level, log_format, metrics_port)
    config = _checked(
        lambda: WorkerConfig(lease=lease, heartbeat=heartbeat, timeout_grace=timeout_grace)
    )
    with services(ctx.obj["data_dir"]):
        app = load_app(app_ref)
        runtime = Runtime(app, config, name=name)
        try:
            rq_worker = DuejobsWorker(runtime, [check_queue(q) for q in queues], name=name)
        except DuejobsError as exc:
            _fail(exc)
        rq_worker.work(burst=burst, logging_level=log_level.upper(), with_scheduler=False)
        runtime.close()
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
@click.option(
    "--window",
    type=DURATION,
    default=spell_duration(_RECONCILE.window),
    show_default=True,
    help="How far ahead to check.",
)
@click.option("--json", "as_json", is_flag=True, help="Print JSON (one line per pass).")
@click.option(
    "--stats-every",
    type=POSITIVE,
    default=spell_duration(metrics.GaugeRefresh.DEFAULT_EVERY),
    show_default=True,
    help="With --metrics-port: refresh the stats gauges at most this often.",
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
        gauges = metrics.GaugeRefresh(lambda: collect_stats(app), stats_every)

        def report(result: ReconcileResult) -> None:
            _print_reconciled(result, as_json)
            if metrics_port is not None:
                gauges.maybe_refresh()

        if every is None:
            report(reconciler.run_once())
            return
        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, lambda *_: reconciler.stop())
        reconciler.run(every, report=report)


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
@click.pass_context
def prune(
    ctx: click.Context, older_than: timedelta, batch_size: int, every: timedelta | None
) -> None:
    """Delete finished schedules (and their history) older than --older-than, in batches."""
    config = _checked(lambda: PruneConfig(older_than=older_than, batch_size=batch_size))

    def report(result: PruneResult) -> None:
        click.echo(
            f"pruned {result.deleted} finished schedules with their history in "
            f"{result.seconds:.1f} s ({result.rate:,.0f} rows/s)"
        )

    with _app(ctx) as app:
        pruner = Pruner(app, config)
        if every is None:
            report(pruner.run_once())
            return
        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, lambda *_: pruner.stop())
        pruner.run(every, report=report)


@main.group()
def recurring() -> None:
    """Recurring schedules: cron in a time zone, with DST and misfire policies."""


def _print_recurring(r: Recurring) -> None:
    data = {k: (v.isoformat() if isinstance(v, datetime) else v) for k, v in asdict(r).items()}
    data["id"], data["grace"] = str(r.id), r.grace.total_seconds()
    click.echo(json.dumps(data, default=str))


_TENANT = click.option("--tenant", default=None, help="Tenant name (default: 'default').")


@recurring.command("set")
@click.argument("name")
@click.option("--cron", required=True, help="Cron expression, e.g. '0 9 * * MON-FRI'.")
@click.option("--type", "job_type", required=True, help="Job type of each occurrence.")
@click.option("--tz", "timezone", default="UTC", show_default=True, help="IANA zone.")
@click.option("--payload", default="{}", show_default=True, help="JSON payload.")
@click.option("--dst-gap", type=click.Choice([g.value for g in DstGap]), default="shift")
@click.option("--dst-overlap", type=click.Choice([o.value for o in DstOverlap]), default="once")
@click.option("--misfire", type=click.Choice([m.value for m in Misfire]), default="latest")
@click.option(
    "--grace", type=DURATION, default="0s", show_default=True, help="Late by less: on time."
)
@_TENANT
@click.pass_context
def recurring_set(
    ctx: click.Context,
    name: str,
    cron: str,
    job_type: str,
    timezone: str,
    payload: str,
    dst_gap: str,
    dst_overlap: str,
    misfire: str,
    grace: timedelta,
    tenant: str | None,
) -> None:
    """Create or replace the recurring schedule NAME."""
    try:
        data = json.loads(payload)
    except ValueError as exc:
        raise click.BadParameter(f"not JSON: {exc}", param_hint="--payload") from exc
    with _app(ctx) as app:
        _print_recurring(
            app.recurring(
                name,
                cron=cron,
                type=job_type,
                payload=data,
                timezone=timezone,
                tenant=tenant,
                dst_gap=dst_gap,
                dst_overlap=dst_overlap,
                misfire=misfire,
                grace=grace,
            )
        )


@recurring.command("show")
@click.argument("name")
@_TENANT
@click.pass_context
def recurring_show(ctx: click.Context, name: str, tenant: str | None) -> None:
    """Show the recurring schedule NAME (exit 1 if there is none)."""
    with _app(ctx) as app:
        found = app.get_recurring(name, tenant=tenant)
        if found is None:
            click.echo(f"error: no recurring schedule {name!r}", err=True)
            sys.exit(1)
        _print_recurring(found)


@recurring.command("pause")
@click.argument("name")
@_TENANT
@click.pass_context
def recurring_pause(ctx: click.Context, name: str, tenant: str | None) -> None:
    """Pause NAME: its occurrences not yet run are cancelled."""
    with _app(ctx) as app:
        _print_recurring(app.pause_recurring(name, tenant=tenant))


@recurring.command("resume")
@click.argument("name")
@_TENANT
@click.pass_context
def recurring_resume(ctx: click.Context, name: str, tenant: str | None) -> None:
    """Resume NAME from its next occurrence after now."""
    with _app(ctx) as app:
        _print_recurring(app.resume_recurring(name, tenant=tenant))


@recurring.command("delete")
@click.argument("name")
@_TENANT
@click.pass_context
def recurring_delete(ctx: click.Context, name: str, tenant: str | None) -> None:
    """Delete NAME (exit 1 if there is none); occurrences keep their history."""
    with _app(ctx) as app:
        deleted = app.delete_recurring(name, tenant=tenant)
        click.echo("deleted" if deleted else f"no recurring schedule {name!r}")
        sys.exit(0 if deleted else 1)


def _cap(value: str | None, name: str) -> int | Unset | None:
    if value is None:
        return UNSET
    if value.lower() == "none":
        return None
    if value.isdigit():
        return int(value)
    raise click.BadParameter("a number >= 0 or 'none'", param_hint=name)


@main.command()
@click.argument("tenant", required=False)
@click.option("--max-live", help="Cap on live schedules, or 'none' to clear it.")
@click.option("--max-inflight", help="Cap on jobs pushed or running, or 'none' to clear it.")
@click.pass_context
def quota(
    ctx: click.Context, tenant: str | None, max_live: str | None, max_inflight: str | None
) -> None:
    """Set TENANT's quotas ('*' sets the defaults); without options, list them all."""
    live = _cap(max_live, "--max-live")
    inflight = _cap(max_inflight, "--max-inflight")
    with _app(ctx) as app:
        if tenant is None or (isinstance(live, Unset) and isinstance(inflight, Unset)):
            if tenant is not None:
                raise click.UsageError("give --max-live and/or --max-inflight")
            for q in app.quotas():
                click.echo(
                    f"{q.tenant}: max_live={_cap_text(q.max_live, q.tenant)} "
                    f"max_inflight={_cap_text(q.max_inflight, q.tenant)}"
                )
            return
        app.set_quota(tenant, max_live=live, max_inflight=inflight)
        for name, value in (("live schedules", live), ("jobs in flight", inflight)):
            if not isinstance(value, Unset):
                the = "the " if value is None and tenant != "*" else ""
                click.echo(f"quota of {tenant}: {the}{_cap_text(value, tenant)} {name}")


def _cap_text(value: int | None, tenant: str) -> str:
    """A stored cap: a tenant's empty one follows the default; the default's means none."""
    if value is not None:
        return str(value)
    return "no cap" if tenant == "*" else "default"


@main.command()
@click.pass_context
def demo(ctx: click.Context) -> None:
    """The whole system end to end: scheduler, workers, reconciler and a realistic mix."""
    from duejobs.demo import register, run_demo

    with _app(ctx, migrate=True) as app:
        status = run_demo(register(app), ctx.obj["data_dir"], click.echo)
    sys.exit(status)
