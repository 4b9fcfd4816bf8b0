"""A seeded workload through a deployment's topology (a pooler, a failover pair) with a fault
in the middle, and what it came to: the counts the topology tests hold to zero and the
recovery time they print.

The services run as processes, as deployed: a scheduler, a worker with 8 slots and a
reconciler, all given the topology's URL. The schedules are spread over a few seconds of
``run_at``; the fault comes a third of the way in.
"""

from __future__ import annotations

import dataclasses
import random
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta

import pytest
from sqlalchemy import text

from duejobs import App
from tests.support.processes import Proc

# A handler that records each run (tests.support.apps.traced), short enough to finish in the spread.
HANDLER = "traced"


@dataclass(frozen=True)
class Counts:
    """What a run came to. ``lost``: schedules not succeeded by the deadline; ``twice``:
    attempts whose handler ran more than once; ``rescued``: schedules whose handler ran in an
    attempt the reconciler then took back, and so ran again (the documented way a handler
    runs twice);
    ``early``: runs started before their ``run_at``; ``exited``: services that ended;
    ``recovery``: seconds from the fault to the first run finished after it."""

    schedules: int
    lost: int
    twice: int
    rescued: int
    early: int
    exited: list[str]
    recovery: float
    # seconds from the moment the servers were back (a promoted standby accepting writes)
    # to that first run's end, when the fault says when that was
    after_back: float | None = None
    evidence: str = ""  # the history of a schedule counted above, to read on a failure

    def line(self, name: str) -> str:
        back = "" if self.after_back is None else f" ({self.after_back:.1f} s after the "
        back += "" if self.after_back is None else "servers were back)"
        return (
            f"{name}: {self.schedules} schedules, {self.lost} lost, {self.twice} run twice "
            f"in one attempt, {self.rescued} rescued and run again, {self.early} early, "
            f"{len(self.exited)} services exited; first job {self.recovery:.1f} s after the "
            f"fault{back}"
        )


def run_workload(
    spawn: Callable[..., Proc],
    url: str,
    read_url: str,
    fault: Callable[[], float | None],
    *,
    seed: int,
    schedules: int = 200,
    spread: float = 6.0,
    worker_flags: tuple[str, ...] = (),
    redis_url: str | None = None,
    queues: tuple[str, ...] = (),
) -> Counts:
    """Schedules spread over ``spread`` seconds through ``url``, the services started on it,
    ``fault()`` a third of the way in (returning, if it knows, the time.time() at which the
    servers were back), then every schedule waited for (two minutes at most);
    the counts are read through ``read_url`` (the server that holds the data after the
    fault). ``redis_url``: the services' Redis, when not the suite's. ``queues``: the
    schedules spread over them in turn, the worker serving them all. The lease is longer
    than any fault here lasts on a busy machine (a failover has taken 5 s): an outcome that
    waits out an outage longer than its lease is rescued and its handler runs again, a
    documented case these runs do not measure."""
    rng = random.Random(seed)
    env = {"DUEJOBS_DATABASE_URL": url, **({"DUEJOBS_REDIS_URL": redis_url} if redis_url else {})}
    producer = App(url, redis_url, strict_types=False)
    start = producer.now() + timedelta(seconds=1)
    ids = [
        producer.schedule(
            HANDLER,
            {"seconds": rng.choice((0, 0.05, 0.2))},
            run_at=start + timedelta(seconds=rng.uniform(0, spread)),
            **({"queue": queues[n % len(queues)]} if queues else {}),
        ).id
        for n in range(schedules)
    ]
    serving = [flag for queue in queues for flag in ("--queue", queue)]
    producer.close()
    services = {
        "scheduler": spawn("scheduler", "--poll-interval", "50ms", extra_env=env),
        "worker": spawn(
            "worker",
            "--app",
            "tests.support.apps:app",
            "--concurrency",
            "8",
            "--lease",
            "15s",
            "--heartbeat",
            "1s",
            *worker_flags,
            *serving,
            extra_env=env,
        ),
        "reconciler": spawn("reconcile", "--every", "1s", extra_env=env),
    }
    time.sleep(1 + spread / 3)
    faulted_at = time.time()
    back_at = fault()
    reader = App(read_url, strict_types=False)
    try:
        deadline = time.monotonic() + 120
        while _unfinished(reader, ids) and time.monotonic() < deadline:
            time.sleep(0.5)
        exited = [name for name, proc in services.items() if proc.popen.poll() is not None]
        counts = _count(reader, ids, faulted_at, exited)
        if back_at is not None:
            counts = dataclasses.replace(
                counts, after_back=counts.recovery - (back_at - faulted_at)
            )
        logs = "\n".join(
            f"--- {name}\n{_troubles(proc.output())}" for name, proc in services.items()
        )
        return dataclasses.replace(counts, evidence=f"{counts.evidence}\n{logs}")
    finally:
        reader.close()


def report(capsys: pytest.CaptureFixture[str], name: str, counts: Counts) -> None:
    """Print a run's counts under its name, past pytest's capture (the figures the docs
    quote)."""
    with capsys.disabled():
        print(f"\n{counts.line(name)}")


def _troubles(log: str) -> str:
    """The lines of a service's log at WARNING or above, with what follows each (a
    traceback), for a failure's message."""
    kept, keep = [], False
    for line in log.splitlines():
        if line[:4].isdigit():  # a new record: "2026-12-04 20:10:46,838 LEVEL ..."
            keep = any(f" {level} " in line for level in ("WARNING", "ERROR", "CRITICAL"))
        if keep:
            kept.append(line)
    return "\n".join(kept[-200:])


def _unfinished(app: App, ids: list[uuid.UUID]) -> int:
    try:
        with app.engine.connect() as conn:
            return int(
                conn.execute(
                    text(
                        "SELECT count(*) FROM scheduled_jobs WHERE id = ANY(:ids) "
                        "AND status <> 'succeeded'"
                    ),
                    {"ids": ids},
                ).scalar_one()
            )
    except Exception:  # the server is still coming back
        return len(ids)


def _count(app: App, ids: list[uuid.UUID], faulted_at: float, exited: list[str]) -> Counts:
    with app.engine.connect() as conn:
        lost = _unfinished(app, ids)
        twice = conn.execute(
            text(
                "SELECT count(*) FROM (SELECT 1 FROM test_runs GROUP BY schedule_id, "
                "version, attempt HAVING count(*) > 1) AS t"
            )
        ).scalar_one()
        # An attempt rescued after its handler had started: that handler runs again in the
        # next attempt. (One rescued before its handler started, its claim's answer lost,
        # only waited for its lease.)
        rescued_ids = (
            conn.execute(
                text(
                    "SELECT DISTINCT a.schedule_id FROM scheduled_job_attempts a "
                    "JOIN test_runs r ON (r.schedule_id, r.version, r.attempt) "
                    "= (a.schedule_id, a.version, a.attempt) "
                    "WHERE a.status = 'abandoned' AND a.schedule_id = ANY(:ids)"
                ),
                {"ids": ids},
            )
            .scalars()
            .all()
        )
        early = conn.execute(
            text(
                "SELECT count(*) FROM test_runs r JOIN scheduled_jobs s ON s.id = r.schedule_id "
                "WHERE r.started_at < s.run_at"
            )
        ).scalar_one()
        first = conn.execute(
            text(
                "SELECT min(extract(epoch FROM ended_at)) FROM test_runs "
                "WHERE started_at >= to_timestamp(:at)"
            ),
            {"at": faulted_at},
        ).scalar_one()
    recovery = float(first) - faulted_at if first is not None else float("inf")
    evidence = "\n".join(
        f"{e.at:%H:%M:%S.%f} {e.kind.value} v{e.version} {e.detail}"
        for e in (app.history(rescued_ids[0]) if rescued_ids else [])
    )
    return Counts(
        len(ids),
        lost,
        int(twice),
        len(rescued_ids),
        int(early),
        exited,
        recovery,
        evidence=evidence,
    )
