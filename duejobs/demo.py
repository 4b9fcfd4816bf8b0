"""``duejobs demo``: a realistic mix of schedules written, changed and read back.

Exit status 0 only when everything the demo wrote reads back as intended.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timedelta

from duejobs.app import App
from duejobs.models import EventKind, Schedule, Status


def _row(s: Schedule) -> str:
    local = s.run_at_local.strftime("%Y-%m-%d %H:%M:%S %Z")
    return f"{s.type:<18} {s.status.value:<10} v{s.version:<3} {local:<28} {s.key or ''}"


def run_demo(app: App, echo: Callable[[str], None]) -> int:
    """Write the mix, print it, and return the exit status."""
    acme = app.tenant("acme")
    now = app.now()
    run = now.strftime("%H%M%S%f")
    reminder = acme.schedule(
        "send-reminder", {"reminder_id": 42}, delay=timedelta(minutes=30), key=f"reminder:{run}"
    )
    again = acme.schedule(
        "send-reminder", {"reminder_id": 42}, delay=timedelta(minutes=30), key=f"reminder:{run}"
    )
    tomorrow = (now + timedelta(days=1)).date()
    local_nine = datetime(tomorrow.year, tomorrow.month, tomorrow.day, 9, 0)
    morning = acme.schedule(
        "morning-digest",
        {"user_id": 7},
        run_at=local_nine,
        timezone="America/Sao_Paulo",
        key=f"digest:7:{tomorrow}",
    )
    expiry = acme.schedule("expire-reservation", {"reservation_id": 9}, delay=timedelta(minutes=15))
    moved = acme.reschedule(expiry.id, delay=timedelta(minutes=45), expected_version=1)
    follow_up = acme.schedule("follow-up", {"lead_id": 3}, delay=timedelta(hours=2))
    acme.cancel(follow_up.id)

    rows = [acme.get(s.id) for s in (reminder, morning, moved, follow_up)]
    echo(f"database time: {now.isoformat()}")
    echo(f"{'type':<18} {'status':<10} {'ver':<4} {'run at (local)':<28} key")
    for s in rows:
        assert s is not None
        echo(_row(s))
    echo("history of the rescheduled reservation expiry:")
    for e in acme.history(moved.id):
        echo(f"  v{e.version} {e.kind.value:<11} {e.detail.get('new_run_at') or ''}")

    checks = {
        "30-minute reminder stored": reminder.status is Status.SCHEDULED,
        "same key returned the same schedule": again.id == reminder.id,
        "09:00 America/Sao_Paulo kept as local time": morning.run_at_local.hour == 9,
        "reschedule bumped the version": moved.version == 2,
        "history keeps old and new times": [e.kind for e in acme.history(moved.id)]
        == [EventKind.CREATED, EventKind.RESCHEDULED],
        "cancellation persisted": (acme.get(follow_up.id) or follow_up).status is Status.CANCELLED,
        "other tenants see none of it": app.tenant("globex").get(reminder.id) is None,
    }
    for name, ok in checks.items():
        echo(f"{'ok ' if ok else 'FAIL'} {name}")
    return 0 if all(checks.values()) else 1
