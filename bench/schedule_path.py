"""The files one schedule's life runs through, followed in the code: ``App.schedule``, the
scheduler's pass that pushes it, the loss of its job (Redis flushed) and the reconciler's pass
that pushes it again — the span the target is set for —, then the worker's run of it, counted
apart. Every module of the package a function of which ran (the code modules run as they are
imported left out), and the SQL file of every statement sent. Recorded with the interpreter's
profiler in every thread, in a process of its own (a profiler in the test suite's processes
slows their workers' threads past use).

The passes' own work is counted with the schedule's (quotas, metrics, traces, the set-up of
new connections): what a newcomer reads to follow it. The recurring definitions' pass, on a
loop of its own beside the scheduler's claims, is not on a one-off schedule's path.
Target: 25 files from ``App.schedule`` to the reconciler's re-push.

    python -m bench.schedule_path
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

from redis import Redis

from bench.common import scratch_database
from duejobs import App, Context
from duejobs.scheduler.loop import Scheduler
from duejobs.services.reconciler import Reconciler
from duejobs.store import execution
from duejobs.worker import build_worker

PACKAGE = Path(execution.__file__).resolve().parent.parent
TARGET = 25
# The statement behind each name: the SQL file it is written in.
SQL_FILE_OF = {
    line.removeprefix("-- name: ").strip(): path.name
    for path in (PACKAGE / "store" / "sql").glob("*.sql")
    for line in path.read_text().splitlines()
    if line.startswith("-- name: ")
}


@dataclass
class Trail:
    """Where the code went while it was followed."""

    files: set[str] = field(default_factory=set)

    def called(self, frame: FrameType, event: str, _arg: Any) -> None:
        code = frame.f_code
        if event != "call" or code.co_name == "<module>":
            return
        path = Path(code.co_filename)
        if PACKAGE not in path.parents:
            return
        self.files.add(str(path.relative_to(PACKAGE)))
        if code is execution._query.__code__:  # every statement is looked up here by name
            self.files.add(f"store/sql/{SQL_FILE_OF[frame.f_locals['name']]}")


@contextmanager
def followed() -> Iterator[Trail]:
    trail = Trail()
    threading.setprofile(trail.called)
    sys.setprofile(trail.called)
    try:
        yield trail
    finally:
        sys.setprofile(None)
        threading.setprofile(None)  # type: ignore[arg-type]


def _record(ctx: Context, payload: Any) -> None:
    """The handler: nothing but duejobs' own work around it."""


def main() -> int:
    with scratch_database() as (database_url, redis_url):
        app = App(database_url=database_url, redis_url=redis_url)
        app.handler("record")(_record)
        scheduler, reconciler = Scheduler(app), Reconciler(app)
        worker = build_worker(app)
        try:
            with followed() as trail:
                schedule = app.schedule("record", {}, delay=0)
                scheduler.run_once()
                Redis.from_url(redis_url).flushdb()  # its job lost
                reconciler.run_once()
            with followed() as run:
                worker.work(burst=True)
            done = app.get(schedule.id)
        finally:
            worker.runtime.close()
            scheduler.close()
            app.close()
    assert done is not None and done.status.value == "succeeded", done
    sql = sorted(f for f in trail.files if f.endswith(".sql"))
    modules = sorted(f for f in trail.files if f.endswith(".py"))
    print(f"{len(modules)} modules:", *modules, sep="\n  ")
    print(f"{len(sql)} SQL files:", *sql, sep="\n  ")
    more = sorted(run.files - trail.files)
    print(f"then the worker's run, {len(more)} files more:", *more, sep="\n  ")
    verdict = "ok  " if len(trail.files) <= TARGET else "MISS"
    print(
        f"{verdict} one schedule, App.schedule to the reconciler's re-push: "
        f"{len(trail.files)} files (target <= {TARGET}); with the worker's run "
        f"{len(trail.files | run.files)}"
    )
    return 0 if len(trail.files) <= TARGET else 1


if __name__ == "__main__":
    sys.exit(main())
