"""Commands on schedules: ``schedule``, ``reschedule``, ``run-now``, ``cancel``, ``retry``,
``show``, ``list``. Those on one schedule take its id or ``--key`` (with ``--tenant``)."""

from __future__ import annotations

import json
import sys
from datetime import datetime, timedelta
from typing import Any

import click

from duejobs.app.application import App
from duejobs.cli.base import DURATION, JSON_TEXT, TENANT_OPTION, F, _app
from duejobs.cli.group import main
from duejobs.models import Event, Schedule, Status
from duejobs.terminal import printable
from duejobs.validation import DEFAULT_TENANT, MAX_PRIORITY, MIN_PRIORITY


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
        "priority": s.priority,
        "queue_job_id": s.queue_job_id,
        "last_error": s.last_error,
        "payload": s.payload,
        "created_at": s.created_at.isoformat(),
        # reschedule, run-now: whether the version replaced was running (its handler goes on
        # unless it checks ctx.ensure_current()); absent for a read
        **({} if s.was_running is None else {"was_running": s.was_running}),
    }


def _event_dict(e: Event) -> dict[str, Any]:
    return {
        "id": e.id,
        "at": e.at.isoformat(),
        "kind": e.kind.value,
        "version": e.version,
        **e.detail,
    }


def _print_schedule(s: Schedule, as_json: bool) -> None:
    data = _schedule_dict(s)
    if as_json:
        click.echo(json.dumps(data, default=str))
        return
    for name, value in data.items():
        shown = json.dumps(value, ensure_ascii=False) if name == "payload" else value
        click.echo(f"{name:>13}  {printable(shown)}")


PRIORITY_OPTION = click.option(
    "--priority",
    type=click.IntRange(MIN_PRIORITY, MAX_PRIORITY),
    help="Higher runs first among due work (-100 to 100; default: the type's, else 0).",
)


def _when_options(func: F) -> F:
    func = click.option("--tz", "timezone", help="IANA zone; --at without an offset is local.")(
        func
    )
    func = click.option("--at", "at", help="ISO 8601 time, e.g. 2026-10-30T09:00:00-03:00.")(func)
    return click.option(
        "--in", "delay", type=DURATION, help="Delay from the database clock: 45s, 30m, 1h30m."
    )(func)


def _when(delay: timedelta | None, at: str | None) -> dict[str, Any]:
    if delay is not None and at is not None:
        raise click.UsageError("give --in or --at, not both")
    if at is not None:
        try:
            return {"run_at": datetime.fromisoformat(at)}
        except ValueError as exc:
            raise click.BadParameter(f"not an ISO 8601 time: {at!r}", param_hint="--at") from exc
    if delay is not None:
        return {"delay": delay}
    return {}


def _one_target(schedule_id: str | None, key: str | None, tenant: str | None) -> None:
    """A command on one schedule takes its id or its key (with --tenant), not both."""
    if schedule_id is None and key is None:
        raise click.UsageError("give a SCHEDULE_ID or --key")
    if schedule_id is not None and key is not None:
        raise click.UsageError("give a SCHEDULE_ID or --key, not both")
    if schedule_id is not None and tenant is not None:
        raise click.UsageError("--tenant goes with --key (an id names its schedule)")


def _by_key(app: App, key: str, tenant: str | None, *, finished: bool = False) -> str:
    """The id of the live schedule holding ``key`` (``finished``: of its latest failed or
    cancelled one, which is what a retry takes), or exit 1 saying there is none."""
    if finished:
        page = app.list(
            key=key,
            tenant=tenant,
            status=[Status.FAILED, Status.CANCELLED],
            latest_first=True,
            limit=1,
        )
        found = page.schedules[0] if page.schedules else None
    else:
        found = app.get_by_key(key, tenant=tenant)
    if found is None:
        which = "failed or cancelled" if finished else "live"
        click.echo(f"error: no {which} schedule holds key {printable(key)}", err=True)
        sys.exit(1)
    return str(found.id)


def _target_options(func: F) -> F:
    """SCHEDULE_ID, or --key with --tenant: the schedule a command acts on."""
    func = TENANT_OPTION(func)
    func = click.option("--key", help="The schedule holding this key, instead of an id.")(func)
    return click.argument("schedule_id", required=False)(func)


@main.command()
@click.argument("job_type")
@_when_options
@click.option(
    "--payload",
    type=JSON_TEXT,
    default="{}",
    show_default=True,
    help="JSON payload (ids, not copies).",
)
@click.option("--key", help="Business key: scheduling a live key again returns the same schedule.")
@TENANT_OPTION
@PRIORITY_OPTION
@click.option(
    "--app",
    "app_ref",
    envvar="DUEJOBS_APP",
    help="MODULE:APP whose handlers JOB_TYPE must be one of (as the worker's --app; default: "
    "$DUEJOBS_APP, else unchecked).",
)
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.pass_context
def schedule(
    ctx: click.Context,
    job_type: str,
    delay: timedelta | None,
    at: str | None,
    timezone: str | None,
    payload: object,
    key: str | None,
    tenant: str | None,
    priority: int | None,
    app_ref: str | None,
    as_json: bool,
) -> None:
    """Schedule JOB_TYPE --in DURATION or --at TIME.

    With --app (or DUEJOBS_APP), a type that App has no handler for is refused, naming the
    types it has."""
    with _app(ctx, app_ref=app_ref) as app:
        s = app.schedule(
            job_type,
            payload,
            timezone=timezone,
            key=key,
            tenant=tenant,
            priority=priority,
            **_when(delay, at),
        )
        _print_schedule(s, as_json)


@main.command()
@_target_options
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.pass_context
def cancel(
    ctx: click.Context,
    schedule_id: str | None,
    key: str | None,
    tenant: str | None,
    as_json: bool,
) -> None:
    """Cancel a schedule by SCHEDULE_ID or --key (exit 1 if none was scheduled or running)."""
    _one_target(schedule_id, key, tenant)
    with _app(ctx) as app:
        if key is not None:
            cancelled = app.cancel_by_key(key, tenant=tenant)
        else:
            assert schedule_id is not None
            cancelled = app.cancel(schedule_id)
    if as_json:
        click.echo(json.dumps({"cancelled": cancelled}))
    else:
        click.echo("cancelled" if cancelled else "not cancelled: not scheduled or running")
    sys.exit(0 if cancelled else 1)


@main.command()
@_target_options
@_when_options
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.pass_context
def retry(
    ctx: click.Context,
    schedule_id: str | None,
    key: str | None,
    tenant: str | None,
    delay: timedelta | None,
    at: str | None,
    timezone: str | None,
    as_json: bool,
) -> None:
    """Schedule a failed or cancelled schedule again (by SCHEDULE_ID, or --key: its latest
    failed or cancelled one): now, --in DURATION or --at TIME."""
    _one_target(schedule_id, key, tenant)
    when = _when(delay, at)
    with _app(ctx) as app:
        target = schedule_id or _by_key(app, str(key), tenant, finished=True)
        s = app.retry(target, timezone=timezone, **when)
        _print_schedule(s, as_json)


@main.command()
@_target_options
@_when_options
@click.option("--expected-version", type=int, help="Refuse if the schedule moved meanwhile.")
@PRIORITY_OPTION
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.pass_context
def reschedule(
    ctx: click.Context,
    schedule_id: str | None,
    key: str | None,
    tenant: str | None,
    delay: timedelta | None,
    at: str | None,
    timezone: str | None,
    expected_version: int | None,
    priority: int | None,
    as_json: bool,
) -> None:
    """Move a schedule (by SCHEDULE_ID or --key) --in DURATION or --at TIME (its version goes
    up by one)."""
    _one_target(schedule_id, key, tenant)
    when = _when(delay, at)
    if not when:
        raise click.UsageError("give the new time: --in DURATION or --at TIME")
    with _app(ctx) as app:
        target = schedule_id or _by_key(app, str(key), tenant)
        s = app.reschedule(
            target,
            timezone=timezone,
            expected_version=expected_version,
            priority=priority,
            **when,
        )
        _print_schedule(s, as_json)


@main.command(name="run-now")
@_target_options
@click.option("--expected-version", type=int, help="Refuse if the schedule moved meanwhile.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.pass_context
def run_now(
    ctx: click.Context,
    schedule_id: str | None,
    key: str | None,
    tenant: str | None,
    expected_version: int | None,
    as_json: bool,
) -> None:
    """Make a live schedule (by SCHEDULE_ID or --key) due now: the next scheduler pass
    pushes it (its version goes up by one)."""
    _one_target(schedule_id, key, tenant)
    with _app(ctx) as app:
        target = schedule_id or _by_key(app, str(key), tenant)
        s = app.run_now(target, expected_version=expected_version)
        _print_schedule(s, as_json)


@main.command()
@_target_options
@click.option(
    "--events",
    "newest",
    type=click.IntRange(1, 1000),
    default=50,
    show_default=True,
    help="How many of the latest events to show (oldest first).",
)
@click.option(
    "--before",
    type=click.IntRange(1),
    help="Show the events before this event id (the id an earlier page named).",
)
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.pass_context
def show(
    ctx: click.Context,
    schedule_id: str | None,
    key: str | None,
    tenant: str | None,
    newest: int,
    before: int | None,
    as_json: bool,
) -> None:
    """Show a schedule (by SCHEDULE_ID, or --key: the live one holding it) and its latest
    events; a long history a page at a time (--before the id the page names)."""
    _one_target(schedule_id, key, tenant)
    with _app(ctx) as app:
        schedule_id = schedule_id or _by_key(app, str(key), tenant)
        s = app.get(schedule_id)
        if s is None:
            click.echo(f"error: no schedule {schedule_id}", err=True)
            sys.exit(1)
        page = app.history(schedule_id, newest=newest, before=before)
        # where the next page starts, if any event is older than this page's last
        older = page and len(page) == newest and app.history(s.id, newest=1, before=page[-1].id)
        earlier = page[-1].id if older else None
    events = list(reversed(page))
    if as_json:
        out = {
            **_schedule_dict(s),
            "history": [_event_dict(e) for e in events],
            "earlier_before": earlier,
        }
        click.echo(json.dumps(out, default=str))
        return
    _print_schedule(s, as_json=False)
    click.echo("history:" if before is None else f"history before event {before}:")
    for e in events:
        detail = " ".join(f"{k}={v}" for k, v in e.detail.items() if v is not None)
        click.echo(f"  {e.at.isoformat()}  v{e.version}  {e.kind.value:<11} {printable(detail)}")
    if earlier is not None:
        click.echo(f"  ... earlier events: duejobs show {s.id} --before {earlier}")


def _instant(value: str | None, flag: str) -> datetime | None:
    if value is None:
        return None
    try:
        return datetime.fromisoformat(value)
    except ValueError as exc:
        raise click.BadParameter(f"not an ISO 8601 time: {value!r}", param_hint=flag) from exc


@main.command(name="list")
@click.option(
    "--status",
    "statuses",
    multiple=True,
    type=click.Choice([s.value for s in Status]),
    help="Keep this status (repeat for several).",
)
@click.option("--type", "job_type", help="Keep this job type.")
@click.option("--key", help="Keep the schedules of this key, finished ones too.")
@click.option("--queue", help="Keep this RQ queue.")
@click.option("--due-from", help="Due at or after this ISO 8601 time.")
@click.option("--due-before", help="Due before this ISO 8601 time.")
@click.option("--recurring", help="Keep the occurrences of this recurring definition.")
@click.option("--tenant", default=None, help="Keep this tenant (default: every tenant).")
@click.option("--limit", type=click.IntRange(1, 1000), default=50, show_default=True)
@click.option("--after", help="The cursor a previous page printed: the page after it.")
@click.option("--latest-first", is_flag=True, help="Latest due first.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON: the page and its cursor.")
@click.pass_context
def list_schedules(
    ctx: click.Context,
    statuses: tuple[str, ...],
    job_type: str | None,
    key: str | None,
    queue: str | None,
    due_from: str | None,
    due_before: str | None,
    recurring: str | None,
    tenant: str | None,
    limit: int,
    after: str | None,
    latest_first: bool,
    as_json: bool,
) -> None:
    """List schedules by due time, a page at a time (the last line names the next page)."""
    with _app(ctx) as app:
        page = app.list(
            status=statuses or None,
            type=job_type,
            key=key,
            queue=queue,
            due_from=_instant(due_from, "--due-from"),
            due_before=_instant(due_before, "--due-before"),
            recurring=recurring,
            tenant=tenant,
            limit=limit,
            after=after,
            latest_first=latest_first,
        )
    warning = page.freshness.warning()
    if warning is not None:
        click.echo(f"warning: {warning}", err=True)
    if key is not None and tenant is None:
        click.echo(
            f"note: keys are per tenant: searched tenant {DEFAULT_TENANT!r}'s (--tenant for "
            "another's)",
            err=True,
        )
    if as_json:
        rows = [_schedule_dict(s) for s in page.schedules]
        listed = {"schedules": rows, "next": page.next_cursor}
        click.echo(json.dumps({**listed, "freshness": page.freshness.as_dict()}, default=str))
        return
    for s in page.schedules:
        key_part = f"  key={s.key}" if s.key else ""
        click.echo(
            f"{s.id}  {s.due_at.isoformat()}  {s.status.value:<9}  {s.tenant}  "
            + printable(f"{s.type}{key_part}")
        )
    if page.next_cursor:
        click.echo(f"next page: --after {page.next_cursor}")
