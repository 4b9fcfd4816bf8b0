"""Setting up and configuring: ``migrate``, ``recurring``, ``quota``, ``rate-limit``,
``demo``."""

from __future__ import annotations

import json
import sys
from dataclasses import asdict
from datetime import datetime, timedelta

import click

from duejobs.app.application import UNSET, Unset
from duejobs.cli.base import (
    DATABASE_ONLY,
    DURATION,
    JSON_TEXT,
    TENANT_OPTION,
    _app,
    _checked,
    _fail,
)
from duejobs.cli.group import main
from duejobs.errors import DuejobsError, InvalidRateError
from duejobs.models import DstGap, DstOverlap, Misfire, Recurring
from duejobs.rates import Rate, parse_rate
from duejobs.services.partition_maintenance import (
    DEFAULT_AHEAD,
    DEFAULT_PERIOD,
    abort_conversion,
    describe,
)
from duejobs.store.partitions import Partitioning
from duejobs.timespec import spell_duration


@main.command()
@click.option(
    "--partitioned",
    is_flag=True,
    help="Partitioned mode: schedules and their history split by time, old ranges dropped "
    "whole (see `duejobs partitions`). Filled tables are moved online: copied in batches "
    "while in use, then swapped in a moment.",
)
@click.option(
    "--partition-period",
    type=DURATION,
    default=spell_duration(DEFAULT_PERIOD),
    show_default=True,
    help="With --partitioned: the time each partition covers (whole hours).",
)
@click.option(
    "--partitions-ahead",
    type=int,
    default=DEFAULT_AHEAD,
    show_default=True,
    help="With --partitioned: partitions kept ready past the current one.",
)
@click.pass_context
def migrate(
    ctx: click.Context, partitioned: bool, partition_period: timedelta, partitions_ahead: int
) -> None:
    """Create or upgrade the schema (idempotent, safe to run concurrently)."""
    settings = (
        _checked(lambda: Partitioning(partition_period, partitions_ahead)) if partitioned else None
    )
    with _app(ctx, needs=DATABASE_ONLY) as app:
        try:
            before, after = app.migrate(partitioned=settings)
        except DuejobsError as exc:
            _fail(exc)
        if before == after:
            click.echo(f"schema already at revision {after}")
        else:
            click.echo(f"schema upgraded from {before or 'nothing'} to {after}")
        mode, _ = describe(app.engine)
        if mode is not None:
            click.echo(f"partitioned: periods of {spell_duration(mode.period)}, {mode.ahead} ahead")


@main.command()
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.option(
    "--abort",
    is_flag=True,
    help="Remove what a conversion killed midway left: its triggers and staging schema.",
)
@click.pass_context
def partitions(ctx: click.Context, as_json: bool, abort: bool) -> None:
    """The partitions of partitioned mode: each range's bounds, its estimated rows, whether a
    live schedule is in it and when its last one finished."""
    if abort:
        with _app(ctx, needs=DATABASE_ONLY) as app:
            left = abort_conversion(app.engine)
        click.echo(
            "removed a stopped conversion's triggers and staging schema"
            if left
            else "no stopped conversion: nothing to remove"
        )
        return
    with _app(ctx) as app:
        mode, found = describe(app.engine)
    if mode is None:
        if as_json:
            click.echo(json.dumps({"partitioned": False, "partitions": []}))
        else:
            click.echo(
                "plain schema (not partitioned): `duejobs migrate --partitioned` on empty tables"
            )
        return
    rows = [
        {
            "name": p.name,
            "start": p.start.isoformat() if p.start else None,
            "end": p.end.isoformat() if p.end else None,
            "rows": p.rows,
            "live": p.live,
            "last_finished": p.last_finished.isoformat() if p.last_finished else None,
        }
        for p in found
    ]
    if as_json:
        click.echo(
            json.dumps(
                {
                    "partitioned": True,
                    "period_seconds": mode.period.total_seconds(),
                    "ahead": mode.ahead,
                    "partitions": rows,
                }
            )
        )
        return
    click.echo(f"partitioned: periods of {spell_duration(mode.period)}, {mode.ahead} ahead")
    for row in rows:
        span = (
            f"{row['start']} .. {row['end']}" if row["start"] else "DEFAULT (outside every range)"
        )
        finished = row["last_finished"] or "-"
        click.echo(
            f"{row['name']:<36} {span:<52} rows~{row['rows']:<10} "
            f"live={'yes' if row['live'] else 'no':<4} last finished {finished}"
        )


@main.group()
def recurring() -> None:
    """Recurring schedules: cron in a time zone, with DST and misfire policies."""


def _print_recurring(r: Recurring) -> None:
    data = {k: (v.isoformat() if isinstance(v, datetime) else v) for k, v in asdict(r).items()}
    data["id"], data["grace"] = str(r.id), r.grace.total_seconds()
    click.echo(json.dumps(data, default=str))


@recurring.command("set")
@click.argument("name")
@click.option("--cron", required=True, help="Cron expression, e.g. '0 9 * * MON-FRI'.")
@click.option("--type", "job_type", required=True, help="Job type of each occurrence.")
@click.option("--tz", "timezone", default="UTC", show_default=True, help="IANA zone.")
@click.option("--payload", type=JSON_TEXT, default="{}", show_default=True, help="JSON payload.")
@click.option("--dst-gap", type=click.Choice([g.value for g in DstGap]), default="shift")
@click.option("--dst-overlap", type=click.Choice([o.value for o in DstOverlap]), default="once")
@click.option("--misfire", type=click.Choice([m.value for m in Misfire]), default="latest")
@click.option(
    "--grace", type=DURATION, default="0s", show_default=True, help="Late by less: on time."
)
@TENANT_OPTION
@click.pass_context
def recurring_set(
    ctx: click.Context,
    name: str,
    cron: str,
    job_type: str,
    timezone: str,
    payload: object,
    dst_gap: str,
    dst_overlap: str,
    misfire: str,
    grace: timedelta,
    tenant: str | None,
) -> None:
    """Create or replace the recurring schedule NAME."""
    with _app(ctx) as app:
        _print_recurring(
            app.recurring(
                name,
                cron=cron,
                type=job_type,
                payload=payload,
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
@TENANT_OPTION
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
@TENANT_OPTION
@click.pass_context
def recurring_pause(ctx: click.Context, name: str, tenant: str | None) -> None:
    """Pause NAME: its occurrences not yet run are cancelled."""
    with _app(ctx) as app:
        _print_recurring(app.pause_recurring(name, tenant=tenant))


@recurring.command("resume")
@click.argument("name")
@TENANT_OPTION
@click.pass_context
def recurring_resume(ctx: click.Context, name: str, tenant: str | None) -> None:
    """Resume NAME from its next occurrence after now."""
    with _app(ctx) as app:
        _print_recurring(app.resume_recurring(name, tenant=tenant))


@recurring.command("delete")
@click.argument("name")
@TENANT_OPTION
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


def _rate(value: str | None, name: str) -> Rate | Unset | None:
    if value is None:
        return UNSET
    if value.lower() == "none":
        return None
    try:
        return parse_rate(value, name)
    except InvalidRateError as exc:
        raise click.BadParameter(str(exc), param_hint=name) from exc


@main.command()
@click.argument("tenant", required=False)
@click.option("--max-live", help="Cap on live schedules, or 'none' to clear it.")
@click.option("--max-inflight", help="Cap on jobs pushed or running, or 'none' to clear it.")
@click.option("--max-rate", help="Starts a period ('10/s', '60/m', '500/h'), or 'none'.")
@click.pass_context
def quota(
    ctx: click.Context,
    tenant: str | None,
    max_live: str | None,
    max_inflight: str | None,
    max_rate: str | None,
) -> None:
    """Set TENANT's quotas ('*' sets the defaults); without options, list them all."""
    live = _cap(max_live, "--max-live")
    inflight = _cap(max_inflight, "--max-inflight")
    rate = _rate(max_rate, "--max-rate")
    with _app(ctx) as app:
        if tenant is None or all(isinstance(v, Unset) for v in (live, inflight, rate)):
            if tenant is not None:
                raise click.UsageError("give --max-live, --max-inflight and/or --max-rate")
            for q in app.quotas():
                click.echo(
                    f"{q.tenant}: max_live={_cap_text(q.max_live, q.tenant)} "
                    f"max_inflight={_cap_text(q.max_inflight, q.tenant)} "
                    f"max_rate={_rate_text(q.max_rate, q.tenant)}"
                )
            return
        app.set_quota(tenant, max_live=live, max_inflight=inflight, max_rate=rate)
        for name, value in (("live schedules", live), ("jobs in flight", inflight)):
            if not isinstance(value, Unset):
                the = "the " if value is None and tenant != "*" else ""
                click.echo(f"quota of {tenant}: {the}{_cap_text(value, tenant)} {name}")
        if not isinstance(rate, Unset):
            the = "the " if rate is None and tenant != "*" else ""
            click.echo(f"rate limit of {tenant}: {the}{_rate_text(rate, tenant)}")


def _cap_text(value: int | None, tenant: str) -> str:
    """A stored cap: a tenant's empty one follows the default; the default's means none."""
    if value is not None:
        return str(value)
    return "no cap" if tenant == "*" else "default"


def _rate_text(value: Rate | None, tenant: str) -> str:
    """A stored rate limit: a tenant's empty one follows the default; the default's, none."""
    if value is not None:
        return str(value)
    return "no limit" if tenant == "*" else "default"


@main.command("rate-limit")
@click.argument("queue", required=False)
@click.argument("rate", required=False)
@click.pass_context
def rate_limit(ctx: click.Context, queue: str | None, rate: str | None) -> None:
    """Limit the starts of QUEUE to RATE ('10/s', '60/m', '500/h'; 'none' clears it);
    without arguments, list every rate limit with its use and its last grant."""
    if queue is not None and rate is None:
        raise click.UsageError("give the RATE ('10/s', '60/m', '500/h' or 'none')")
    parsed = None if rate is None else _rate(rate, "RATE")
    with _app(ctx, needs=DATABASE_ONLY) as app:
        if queue is None:
            for limit in app.rate_limits():
                scope = "queue" if limit.scope == "queue" else "tenant"
                use = (
                    "each tenant counts its own"
                    if limit.recent_starts is None
                    else f"{limit.recent_starts} starts over the last period"
                )
                click.echo(
                    f"{scope} {limit.name}: {limit.rate} "
                    f"({use}; last grant {limit.granted} of {limit.asked})"
                )
            return
        assert not isinstance(parsed, Unset)
        try:
            app.set_rate_limit(queue, parsed)
        except DuejobsError as exc:
            _fail(exc)
        click.echo(f"rate limit of queue {queue}: {parsed if parsed else 'none'}")


@main.command()
@click.pass_context
def demo(ctx: click.Context) -> None:
    """The whole system end to end: scheduler, workers, reconciler and a realistic mix."""
    try:
        from duejobs.dev.demo import register, run_demo
    except ModuleNotFoundError as exc:  # rich, with the embedded servers
        _fail(ModuleNotFoundError(f"duejobs demo needs the embedded extra ({exc})"))

    with _app(ctx, migrate=True, embedded=True) as app:
        status = run_demo(register(app), ctx.obj["data_dir"], click.echo)
    sys.exit(status)
