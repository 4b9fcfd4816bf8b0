"""``duejobs demo``: the whole system, end to end, in under a minute.

It migrates, starts a scheduler, two workers and a reconciler (separate processes, as in
production), schedules a realistic mix — reminders with relative delays, a digest at 09:00
America/Sao_Paulo, a reschedule, a cancellation, a burst of notifications due at the same
instant, a webhook that fails once and is retried — shows live progress, then checks the
outcome: each schedule ran once or was skipped for the right reason, lag p50/p99, attempts.
Everything it started is stopped. Exit status 0 only when every check holds.

Workers import this module (``--app duejobs.dev.demo:app``) for the handlers below: with the
package alone (``duejobs[binary]``, the image's install), as the live progress's ``rich`` is
imported by the demo's run only.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

from duejobs import App, store
from duejobs.config import DATABASE_ENV
from duejobs.models import Status
from duejobs.worker.context import Context

if TYPE_CHECKING:
    from rich.table import Table

BURST = 200
PROCESS_FLAGS = ["--log-level", "warning"]


def _apply(ctx: Context, payload: Any) -> None:
    """The effect of every demo job: recorded once in the effect ledger, cancel-safe."""
    ctx.ensure_current()
    with ctx.transaction():
        pass


def _flaky_webhook(ctx: Context, payload: Any) -> None:
    if ctx.attempt == 1:
        raise ConnectionError("webhook endpoint timed out (the demo fails it once)")
    _apply(ctx, payload)


def register(application: App) -> App:
    for job_type in (
        "send-reminder",
        "expire-reservation",
        "follow-up",
        "morning-digest",
        "campaign-notification",
    ):
        application.handler(job_type)(_apply)
    application.handler("flaky-webhook", backoff=timedelta(milliseconds=500))(_flaky_webhook)
    return application


app = register(App()) if os.environ.get(DATABASE_ENV) else None


@dataclass
class Mix:
    """What the demo scheduled, by role."""

    reminders: list[uuid.UUID]
    digest: uuid.UUID
    rescheduled: uuid.UUID
    cancelled: uuid.UUID
    burst: list[uuid.UUID]
    flaky: uuid.UUID

    @property
    def to_run(self) -> list[uuid.UUID]:
        return [*self.reminders, self.rescheduled, *self.burst, self.flaky]

    @property
    def all(self) -> list[uuid.UUID]:
        return [*self.to_run, self.digest, self.cancelled]


def schedule_mix(application: App) -> Mix:
    acme, globex = application.tenant("acme"), application.tenant("globex")
    now = application.now()
    reminders = [
        acme.schedule("send-reminder", {"reminder_id": i}, delay=timedelta(seconds=1 + i))
        for i in range(10)
    ]
    tomorrow = (now + timedelta(days=1)).date()
    digest = acme.schedule(
        "morning-digest",
        {"user_id": 7},
        run_at=datetime(tomorrow.year, tomorrow.month, tomorrow.day, 9, 0),
        timezone="America/Sao_Paulo",
        key=f"digest:7:{tomorrow}:{now.timestamp()}",
    )
    expiry = acme.schedule("expire-reservation", {"reservation_id": 9}, delay=20)
    acme.reschedule(expiry.id, delay=3, expected_version=1)
    follow_up = globex.schedule("follow-up", {"lead_id": 3}, delay=4)
    globex.cancel(follow_up.id)
    instant = now + timedelta(seconds=6)
    burst = [
        globex.schedule("campaign-notification", {"user_id": i}, run_at=instant)
        for i in range(BURST)
    ]
    flaky = globex.schedule("flaky-webhook", {"order_id": 77}, delay=2)
    return Mix(
        [r.id for r in reminders],
        digest.id,
        expiry.id,
        follow_up.id,
        [b.id for b in burst],
        flaky.id,
    )


def _spawn(args: list[str], log: Path) -> subprocess.Popen[bytes]:
    with open(log, "ab") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "duejobs", *args, *PROCESS_FLAGS],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=os.environ.copy(),
        )


def _state(application: App, ids: list[uuid.UUID]) -> dict[str, int]:
    with application.engine.connect() as conn:
        return store.status_counts(conn, ids)


def _table(state: dict[str, int]) -> Table:
    from rich.table import Table

    table = Table(title="schedules by status", show_edge=False)
    for status in Status:
        table.add_column(status.value, justify="right")
    table.add_row(*(str(state.get(s, 0)) for s in Status))
    return table


def check(application: App, mix: Mix) -> tuple[dict[str, bool], dict[str, float]]:
    """The summary: each check by name, and the lag figures (ms)."""
    with application.engine.connect() as conn:
        per_row = store.outcomes(conn, mix.all)
        p50, p99 = store.start_lag(conn, mix.all)
    once = [per_row[i] for i in mix.to_run]
    flaky, moved, gone = per_row[mix.flaky], per_row[mix.rescheduled], per_row[mix.cancelled]
    checks = {
        f"all {len(once)} due schedules succeeded": all(r.status is Status.SUCCEEDED for r in once),
        "each effect applied exactly once": all(r.effects == 1 for r in once),
        "no job started before its run_at (database clock)": all(r.early == 0 for r in once),
        f"the burst of {BURST} due at one instant all ran once": all(
            per_row[i].status is Status.SUCCEEDED and per_row[i].starts == 1 for i in mix.burst
        ),
        "the rescheduled reservation ran once, at version 2 only": moved.version == 2
        and moved.starts == 1
        and moved.started_version == 2,
        "the cancelled follow-up never started": gone.status is Status.CANCELLED
        and gone.starts == 0,
        "the flaky webhook failed once, then succeeded on attempt 2": flaky.status
        is Status.SUCCEEDED
        and flaky.attempts == 2
        and flaky.effects == 1,
        "the 09:00 America/Sao_Paulo digest waits for its time": per_row[mix.digest].status
        is Status.SCHEDULED,
    }
    return checks, {"p50": p50 or 0.0, "p99": p99 or 0.0}


def _wait_for_workers(
    application: App, count: int, procs: list[subprocess.Popen[bytes]], within: float = 60
) -> None:
    """Until ``count`` workers are registered in RQ (their start-up done: imports, servers
    reached), or one of ``procs`` ended, or ``within`` seconds passed — then the demo goes on
    and its checks say what did not run."""
    deliverer = application.deliverer()
    deadline = time.monotonic() + within
    while time.monotonic() < deadline and all(p.poll() is None for p in procs):
        if deliverer.workers_on() >= count:
            return
        time.sleep(0.1)


def run_demo(application: App, data_dir: Path, echo: Callable[[str], None]) -> int:
    """Run the demo against ``application`` (whose URLs are exported to child processes)."""
    from rich.console import Console, Group
    from rich.live import Live
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
    )

    console = Console()
    logs = data_dir / "demo-logs"
    logs.mkdir(parents=True, exist_ok=True)
    procs = [
        _spawn(["scheduler"], logs / "scheduler.log"),
        _spawn(["worker", "--app", "duejobs.dev.demo:app"], logs / "worker-1.log"),
        _spawn(["worker", "--app", "duejobs.dev.demo:app"], logs / "worker-2.log"),
        _spawn(["reconcile", "--every", "2"], logs / "reconciler.log"),
    ]
    try:
        started = time.monotonic()
        _wait_for_workers(application, 2, procs)
        echo(
            f"scheduler, 2 workers and a reconciler started in {time.monotonic() - started:.1f} s "
            "(the lag below counts from then: a process's start-up is not a delivery's lag)"
        )
        mix = schedule_mix(application)
        echo(
            f"scheduled {len(mix.all)}: 10 reminders, a 09:00 America/Sao_Paulo digest, "
            f"a reschedule, a cancellation, a burst of {BURST} at one instant, a flaky webhook"
        )
        deadline = time.monotonic() + 50
        columns = (
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
        )
        progress = Progress(*columns, console=console)
        task = progress.add_task("running due schedules", total=len(mix.to_run))
        with Live(console=console, refresh_per_second=8) as live:
            while True:
                state = _state(application, mix.all)
                progress.update(task, completed=state.get(Status.SUCCEEDED, 0))
                live.update(Group(progress, _table(state)))
                if state.get(Status.SUCCEEDED, 0) == len(mix.to_run) or time.monotonic() > deadline:
                    break
                time.sleep(0.25)
        checks, lag = check(application, mix)
    finally:
        for proc in procs:
            proc.send_signal(signal.SIGTERM)
        for proc in procs:
            proc.wait(30)
    for name, ok in checks.items():
        echo(f"{'ok  ' if ok else 'FAIL'} {name}")
    echo(
        f"lag run_at -> start: p50 {lag['p50']:.0f} ms, p99 {lag['p99']:.0f} ms (the burst of "
        f"{BURST} due at one instant waits for two one-slot workers; the README's figure, "
        "steady load, is `python -m bench lag`'s)"
    )
    echo(f"logs of the scheduler, workers and reconciler: {logs}")
    return 0 if all(checks.values()) else 1
