"""The delivery path across real processes: several schedulers and workers, skewed clocks,
outages and restarts of Redis and PostgreSQL, graceful and cold shutdown."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import platform
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path

import pytest
import redis
from prometheus_client import Counter
from sqlalchemy import text

from duejobs import App
from duejobs.config import sqlalchemy_url
from duejobs.dev.embedded import EmbeddedRedis
from duejobs.errors import DatabaseUnavailableError
from duejobs.scheduler.loop import PassResult, Scheduler, SchedulerConfig
from duejobs.services import loop as services_loop
from duejobs.services.loop import Loop
from duejobs.store.migrate import upgrade
from tests.support import sample, wait_for
from tests.support.network import free_port
from tests.support.processes import ROOT, SCHEDULER, WORKER, Proc
from tests.support.system import System

FAILED = "duejobs_scheduler_failed_passes_total"


def _count(app: App, sql: str) -> int:
    with app.engine.connect() as conn:
        return int(conn.execute(text(sql)).scalar_one())


def _assert_each_ran_once_and_never_early(app: App, n: int) -> None:
    assert _count(app, "SELECT count(*) FROM scheduled_jobs WHERE status = 'succeeded'") == n
    assert _count(app, "SELECT count(*) FROM test_effects") == n
    assert _count(app, "SELECT count(DISTINCT effect_key) FROM test_effects") == n
    assert _count(app, "SELECT count(*) FROM scheduled_job_attempts") == n
    started = "SELECT count(*) FROM scheduled_job_events WHERE kind = 'started'"
    assert _count(app, started) == n
    early = (
        "SELECT count(*) FROM scheduled_job_events e JOIN scheduled_jobs s "
        "ON s.id = e.schedule_id WHERE e.kind = 'started' AND e.at < s.run_at"
    )
    assert _count(app, early) == 0


def test_duplication_two_schedulers_and_two_workers_run_each_job_once(
    app: App, spawn: Callable[..., Proc]
) -> None:
    n = 400
    for i in range(n):
        app.schedule("record", {"i": i}, delay=timedelta(milliseconds=5 * i), tenant=f"t{i % 3}")
    procs = [spawn(*SCHEDULER), spawn(*SCHEDULER), spawn(*WORKER), spawn(*WORKER)]
    done = "SELECT count(*) FROM scheduled_jobs WHERE status = 'succeeded'"
    wait_for(lambda: _count(app, done) == n, 90, f"{n} jobs to succeed")
    _assert_each_ran_once_and_never_early(app, n)
    workers = _count(app, "SELECT count(DISTINCT worker_pid) FROM test_effects")
    assert workers == 2, "both workers should have taken part"
    assert [p.stop() for p in procs] == [0, 0, 0, 0], [p.output() for p in procs]


def test_peak_thousands_due_at_one_instant_all_run_once(
    app: App, spawn: Callable[..., Proc]
) -> None:
    n = 2000
    instant = app.now() + timedelta(seconds=3)
    for i in range(n):
        app.schedule("record", {"i": i}, run_at=instant)
    procs = [spawn(*SCHEDULER, "--batch-size", "500"), spawn(*WORKER), spawn(*WORKER)]
    done = "SELECT count(*) FROM scheduled_jobs WHERE status = 'succeeded'"
    wait_for(lambda: _count(app, done) == n, 120, f"{n} jobs to succeed")
    _assert_each_ran_once_and_never_early(app, n)
    assert [p.stop() for p in procs] == [0, 0, 0]


def _faketime_env(offset: str) -> dict[str, str]:
    libfaketime = pytest.importorskip("libfaketime")
    if platform.system() != "Linux" or platform.machine() != "x86_64":
        pytest.skip("the bundled libfaketime library is built for Linux x86_64")
    lib = Path(libfaketime.__file__).parent / "vendor" / "libfaketime" / "src"
    return {
        "LD_PRELOAD": str(lib / "libfaketime.so.1"),
        "FAKETIME": offset,
        "DONT_FAKE_MONOTONIC": "1",
        "FAKETIME_NO_CACHE": "1",
    }


@pytest.mark.parametrize("offset", ["+10m", "-10m"])
def test_clock_skew_worker_and_scheduler_ten_minutes_off_run_on_time(
    app: App, spawn: Callable[..., Proc], offset: str
) -> None:
    skew = _faketime_env(offset)
    probe = subprocess.run(
        [sys.executable, "-c", "import time; print(time.time())"],
        env={**os.environ, **skew},
        capture_output=True,
        text=True,
        check=True,
    )
    assert abs(float(probe.stdout) - time.time()) > 500, "the process clock was not skewed"
    n = 30
    for i in range(n):
        app.schedule("record", {"i": i}, delay=timedelta(seconds=1.5 + i * 0.05))
    procs = [spawn(*SCHEDULER, extra_env=skew), spawn(*WORKER, extra_env=skew)]
    done = "SELECT count(*) FROM scheduled_jobs WHERE status = 'succeeded'"
    wait_for(lambda: _count(app, done) == n, 30, "jobs to run on time despite the skew")
    _assert_each_ran_once_and_never_early(app, n)
    late = (
        "SELECT max(extract(epoch FROM e.at - s.run_at)) FROM scheduled_job_events e "
        "JOIN scheduled_jobs s ON s.id = e.schedule_id WHERE e.kind = 'started'"
    )
    with app.engine.connect() as conn:
        assert conn.execute(text(late)).scalar_one() < 60  # not ten minutes late
    assert [p.stop() for p in procs] == [0, 0]


def _slow_job_running(
    app: App, spawn: Callable[..., Proc], seconds: float
) -> tuple[uuid.UUID, list[Proc]]:
    """A scheduler and a worker, the worker busy with a job of ``seconds``."""
    s = app.schedule("slow", {"seconds": seconds}, delay=0)
    procs = [spawn(*SCHEDULER), spawn(*WORKER)]
    running = "SELECT count(*) FROM scheduled_jobs WHERE status = 'running'"
    wait_for(lambda: _count(app, running) == 1, 30, "the slow job to start")
    return s.id, procs


def test_worker_finishes_the_running_job_on_sigterm_then_exits(
    app: App, spawn: Callable[..., Proc]
) -> None:
    schedule_id, procs = _slow_job_running(app, spawn, seconds=2)
    assert procs[1].stop(signal.SIGTERM) == 0
    stored = app.get(schedule_id)
    assert stored is not None and stored.status.value == "succeeded"
    assert procs[0].stop() == 0


def test_cold_shutdown_leaves_a_running_row_with_a_lease_to_rescue(
    app: App, spawn: Callable[..., Proc]
) -> None:
    schedule_id, procs = _slow_job_running(app, spawn, seconds=30)
    procs[1].stop(signal.SIGKILL)
    with app.engine.connect() as conn:
        lease = conn.execute(
            text("SELECT lease_expires_at > now() FROM scheduled_jobs WHERE id = :id"),
            {"id": schedule_id},
        ).scalar_one()
    assert lease is True  # the reconciler rescues it once the lease expires
    assert _count(app, "SELECT count(*) FROM test_effects") == 0
    assert procs[0].stop() == 0


def test_a_services_passes_start_every_pause_however_long_each_takes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The reconciler's rescue bound (the lease plus ``--every``) needs passes that start
    every ``--every``: a pass taking 0.3 s of a 0.5 s pause is followed 0.2 s after it ends,
    one taking 0.7 s at once. On a clock the passes move, so no time is waited. Seen failing
    with the pause waited after the pass's end (0.5 s each)."""
    clock = [0.0]
    monkeypatch.setattr(services_loop.time, "monotonic", lambda: clock[0])
    loop = Loop(
        "rate-test", logging.getLogger("rate-test"), Counter("rate_test_failed", "", registry=None)
    )
    waits: list[float] = []

    def wait(seconds: float, nudgeable: bool = False) -> None:
        waits.append(round(seconds, 6))
        clock[0] += seconds
        if len(waits) == 3:
            loop.stop()

    monkeypatch.setattr(loop, "wait", wait)
    took = iter([0.3, 0.7, 0.1])

    def run_once() -> None:
        clock[0] += next(took)

    pause = timedelta(seconds=0.5)
    loop.run_forever(run_once, lambda _: pause, pause, pause)
    assert waits == [0.2, 0.0, 0.4]


def test_nudges_end_a_nudgeable_wait_and_never_pile_up() -> None:
    """A nudge ends the next wait made nudgeable (not a plain one, a backoff's); a stream of
    nudges, each answered by a wait, leaves at most one token queued. Seen failing with a
    token queued per nudge (a thousand here)."""
    request = services_loop.StopRequest()
    request.nudge()
    started = time.monotonic()
    assert request.wait(0.2) is False and time.monotonic() - started >= 0.2
    assert request.wait(30, nudgeable=True) is False  # the nudge made before it
    for _ in range(1000):
        request.nudge()
        request.nudge()
        request.wait(30, nudgeable=True)
    assert request._wakeup.qsize() <= 1
    request.set()
    assert request.wait(30, nudgeable=True) is True


def test_a_pass_that_asks_for_no_pause_gets_none(monkeypatch: pytest.MonkeyPatch) -> None:
    """After a full batch the scheduler and the recurring loop ask for no pause, and the next
    pass starts at once: a zero pause is a pause of zero, not "none given" (which would wait the
    interval). On a clock the passes move, so no time is waited. Seen failing with the pause
    taken as ``pause(result) or interval``."""
    clock = [0.0]
    monkeypatch.setattr(services_loop.time, "monotonic", lambda: clock[0])
    loop = Loop(
        "zero-pause",
        logging.getLogger("zero-pause"),
        Counter("zero_pause_failed", "", registry=None),
    )
    waits: list[float] = []

    def wait(seconds: float, nudgeable: bool = False) -> None:
        waits.append(seconds)
        clock[0] += seconds
        if len(waits) == 2:
            loop.stop()

    monkeypatch.setattr(loop, "wait", wait)
    interval = timedelta(seconds=5)
    loop.run_forever(lambda: None, lambda _: timedelta(0), interval, interval)
    assert waits == [0.0, 0.0]


def test_the_scheduler_asks_for_no_pause_after_a_full_batch(app: App) -> None:
    scheduler = Scheduler(app, SchedulerConfig(batch_size=10))
    try:
        assert scheduler._pause(PassResult(claimed=10)) == timedelta(0)
        assert scheduler._pause(PassResult(claimed=9)) == scheduler.config.poll_interval
    finally:
        scheduler.close()


# A service loop asked to stop by SIGTERM over and over, the signal landing at a random instant:
# between passes (pause 0: the loop spins through its wait) or during a long wait.
_STOPPED_BY_SIGTERM = """
import logging, os, random, signal, threading
from datetime import timedelta
from prometheus_client import Counter
from duejobs.services.loop import Loop

failed = Counter("signal_test_failed_passes", "")
for round in range(1000):
    loop = Loop("signal-test", logging.getLogger("signal-test"), failed)
    signal.signal(signal.SIGTERM, lambda *_: loop.stop())
    pause = timedelta(0) if round % 2 else timedelta(minutes=2)
    timer = threading.Timer(random.uniform(0, 0.002), os.kill, (os.getpid(), signal.SIGTERM))
    timer.start()
    loop.run_forever(lambda: None, lambda _: pause, pause, pause)
    timer.join()
print("stopped 1000 times")
"""


def test_a_service_stops_on_sigterm_whatever_instant_the_signal_lands(tmp_path: Path) -> None:
    """The CLI's services stop from a signal handler, which Python runs in the main thread
    between two bytecodes: a stop that took a lock the loop's own wait holds hung the process
    for good (a scheduler that never exited on SIGTERM); a signal that landed after the wait
    looked at the stop flag and before it blocked went unseen for the whole wait (two minutes
    here, in one run of three), before the waits were sliced."""
    child = subprocess.Popen(
        [sys.executable, "-c", _STOPPED_BY_SIGTERM],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        out, _ = child.communicate(timeout=60)  # a missed wake-up alone waits two minutes
    except subprocess.TimeoutExpired:
        child.kill()
        pytest.fail("a SIGTERM left the loop running (hung in its stop, or its wait not ended)")
    assert child.returncode == 0 and "stopped 1000 times" in out, out


@contextlib.contextmanager
def _scheduler_thread(app: App) -> Iterator[threading.Thread]:
    """A scheduler loop in a thread, stopped (batch in flight finished) on the way out."""
    config = SchedulerConfig(
        poll_interval=timedelta(milliseconds=50), max_backoff=timedelta(milliseconds=300)
    )
    scheduler = Scheduler(app, config)
    thread = threading.Thread(target=scheduler.run, daemon=True)
    thread.start()
    try:
        yield thread
    finally:
        scheduler.stop()
        thread.join(10)
        scheduler.close()
        assert not thread.is_alive()


def _pushed(app: App, ids: list[object]) -> bool:
    return all((s := app.get(i)) is not None and s.queue_job_id for i in ids)  # type: ignore[arg-type]


def test_scheduler_survives_a_redis_restart(app: App, tmp_path: Path, database_url: str) -> None:
    binary = EmbeddedRedis.binary()
    port = free_port()

    def start_redis() -> subprocess.Popen[bytes]:
        proc = subprocess.Popen(
            [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", ""],
            cwd=tmp_path,
            stdout=subprocess.DEVNULL,
        )
        client = redis.Redis(port=port)
        wait_for(lambda: _answers(client), 10, "redis to start")
        return proc

    server = start_redis()
    local = App(database_url=database_url, redis_url=f"redis://127.0.0.1:{port}/0")
    try:
        with _scheduler_thread(local) as thread:
            before = [local.schedule("record", {}, delay=0).id]
            wait_for(lambda: _pushed(local, before), 10, "the first push")
            server.kill()
            server.wait()
            with pytest.raises(redis.ConnectionError):  # the outage is real
                redis.Redis(port=port).ping()
            failed = sample(FAILED)
            during = [local.schedule("record", {}, delay=0).id for _ in range(5)]
            wait_for(lambda: sample(FAILED) >= failed + 3, 20, "failed passes")
            assert thread.is_alive()
            assert not any(local.get(i).queue_job_id for i in during)  # type: ignore[union-attr]
            server = start_redis()
            wait_for(lambda: _pushed(local, during), 20, "pushes after the restart")
            queue = local.deliverer().queue
            assert sorted(queue.get_job_ids()) == sorted(
                local.get(i).queue_job_id
                for i in during  # type: ignore[union-attr]
            )
            assert thread.is_alive()
    finally:
        local.close()
        server.kill()
        server.wait()


HOLDER = """
import sys
from pathlib import Path
from duejobs.dev.embedded import EmbeddedPostgres
url, _ = EmbeddedPostgres(Path(sys.argv[1])).start()
print(url, flush=True)
sys.stdin.readline()
"""


def test_scheduler_survives_a_postgresql_restart(
    tmp_path: Path, redis_url: str, redis_client: redis.Redis
) -> None:
    def start_postgres() -> tuple[subprocess.Popen[str], str]:
        proc = subprocess.Popen(
            [sys.executable, "-c", HOLDER, str(tmp_path / "pg")],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert proc.stdout is not None
        return proc, proc.stdout.readline().strip()

    def stop_postgres(proc: subprocess.Popen[str]) -> None:
        assert proc.stdin is not None
        proc.stdin.close()
        proc.wait(30)

    holder, url = start_postgres()
    local = App(database_url=url, redis_url=redis_url)
    upgrade(local.engine)
    try:
        with _scheduler_thread(local) as thread:
            first = [local.schedule("record", {}, delay=0).id]
            wait_for(lambda: _pushed(local, first), 10, "the first push")
            stop_postgres(holder)  # the last user leaves: the server shuts down
            with pytest.raises(DatabaseUnavailableError):  # the outage is real
                local.schedule("record", {}, delay=0)
            failed = sample(FAILED)
            wait_for(lambda: sample(FAILED) >= failed + 3, 20, "failed passes")
            assert thread.is_alive()
            holder, url2 = start_postgres()
            assert sqlalchemy_url(url2) == local.settings.database_url
            after = [local.schedule("record", {}, delay=0).id for _ in range(3)]
            wait_for(lambda: _pushed(local, after), 20, "pushes after the restart")
            assert thread.is_alive()
    finally:
        local.close()
        stop_postgres(holder)


def _answers(client: redis.Redis) -> bool:
    try:
        return bool(client.ping())
    except redis.RedisError:
        return False


@pytest.mark.parametrize("read_replica", [False, True], ids=["primary", "read-replica-set"])
def test_a_worker_runs_its_first_job_without_loading_sqlalchemy(
    system: System,
    spawn: Callable[..., Proc],
    tmp_path: Path,
    database_url: str,
    redis_url: str,
    read_replica: bool,
) -> None:
    """A burst worker's claims, outcomes and heartbeat run on connections of its own, so one
    whose handlers open no transaction starts, and finishes its first job, without the
    tenth of a second SQLAlchemy's import costs — a read replica configured or not (its
    engine serves operators' reads, made on first use). Seen failing: ``["sqlalchemy"]``,
    the App's settings and engine loading it as the App was made; with a replica set, its
    engine made with the App."""
    report = tmp_path / "loaded.json"
    with contextlib.closing(App(database_url=database_url, redis_url=redis_url)) as app:
        app.schedule("loaded", {"to": str(report)}, delay=0)
    system.scheduler.run_once()
    replica = {"DUEJOBS_READ_DATABASE_URL": database_url} if read_replica else {}
    worker = spawn("worker", "--app", "tests.support.light_app:app", "--burst", extra_env=replica)
    assert worker.popen.wait(60) == 0, worker.output()
    assert json.loads(report.read_text()) == []


_WORKER_SIGNALLED_AT_EVERY_LINE = """
import logging, signal, sys
from duejobs import App
from duejobs.worker import Runtime, Worker

logging.disable(logging.CRITICAL)
worker = Worker(Runtime(App()))

def at_every_line(frame, event, arg):
    # A SIGTERM landing at this instant: Python runs its handler here, in this thread.
    if event == "line":
        worker._stopped_at = None  # each one a first SIGTERM, which stops the worker
        worker._on_signal(signal.SIGTERM, None)
    return at_every_line

sys.settrace(at_every_line)
worker._stop.wait(0.2)  # the loop's own wait (held by rq suspend, or an outage's pause)
worker.stop()  # a stop under way (the CLI's, the supervisor's)
sys.settrace(None)
print("stopped", worker._stopping())
"""


def test_a_workers_sigterm_never_hangs_it_whatever_line_it_lands_on(env: dict[str, str]) -> None:
    """A signal's handler runs in the main thread between two of its lines: a stop that takes
    a lock that line holds (a ``threading.Event``'s, inside its own ``wait()`` or ``set()``)
    waits for itself for good. Here the handler runs at every line of the worker's wait for a
    stop and of its stop: seen hanging with the worker's stop made of ``threading.Event``."""
    child = subprocess.Popen(
        [sys.executable, "-c", _WORKER_SIGNALLED_AT_EVERY_LINE],
        cwd=ROOT,
        env={**env, "PYTHONPATH": str(ROOT)},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        out, _ = child.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        child.kill()
        pytest.fail("a SIGTERM hung the worker in its own stop")
    assert child.returncode == 0 and "stopped True" in out, out
