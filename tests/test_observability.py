"""Prometheus metrics and structured logs of the long-running commands."""

from __future__ import annotations

import json
import logging
import sys
import urllib.request
from collections.abc import Callable

from duejobs.observability.logs import TextFormatter
from duejobs.terminal import bidi_escaped, printable
from tests.support import sample, wait_for
from tests.support.apps import FORGED
from tests.support.network import free_port
from tests.support.processes import Proc
from tests.support.system import System


def test_worker_counts_outcomes_and_observes_lag_by_type(system: System) -> None:
    before_ok = sample(
        "duejobs_deliveries_total", tenant="acme", type="record", outcome="succeeded"
    )
    before_skip = sample(
        "duejobs_deliveries_total", tenant="acme", type="record", outcome="skipped"
    )
    before_lag = sample("duejobs_lag_seconds_count", tenant="acme", type="record")
    ids = [system.app.schedule("record", {}, delay=0, tenant="acme").id for _ in range(3)]
    system.run_until(lambda: all(system.status(i) == "succeeded" for i in ids))
    system.runtime.handle(ids[0], 1, 1, "acme")  # a duplicate delivery
    after_ok = sample("duejobs_deliveries_total", tenant="acme", type="record", outcome="succeeded")
    assert after_ok - before_ok == 3
    after_skip = sample("duejobs_deliveries_total", tenant="acme", type="record", outcome="skipped")
    assert after_skip - before_skip == 1
    assert sample("duejobs_lag_seconds_count", tenant="acme", type="record") - before_lag == 3


def test_scheduler_counts_what_it_pushed(system: System) -> None:
    before = sample("duejobs_scheduler_pushed_total", where="queue")
    for _ in range(4):
        system.app.schedule("record", {}, delay=0)
    system.scheduler.run_once()
    assert sample("duejobs_scheduler_pushed_total", where="queue") - before == 4


def _scrape(port: int) -> str:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as response:
            return str(response.read().decode())
    except OSError:
        return ""


def test_reconciler_serves_the_stats_figures_as_metrics(
    system: System, spawn: Callable[..., Proc]
) -> None:
    system.app.schedule("record", {}, delay=0, tenant="acme")
    port = free_port()
    proc = spawn("reconcile", "--every", "0.5", "--metrics-port", str(port), "--json")
    wait_for(lambda: 'duejobs_scheduled{tenant="acme"} 1.0' in _scrape(port), 30, "the gauges")
    body = _scrape(port)
    assert "duejobs_schedules_without_job" in body and "duejobs_reconciler_fixed_total" in body
    assert proc.stop() == 0
    passes = [json.loads(line) for line in proc.output().splitlines() if line.startswith("{")]
    assert passes and "repushed" in passes[0]


def test_the_reconciler_refreshes_the_stats_gauges_at_most_every_stats_every(
    system: System, spawn: Callable[..., Proc]
) -> None:
    # The gauges count every live row: a pass every half second must not pay that each time.
    system.app.schedule("record", {}, delay=3600, tenant="acme")
    port = free_port()
    args = ("reconcile", "--every", "0.5", "--stats-every", "1h", "--metrics-port", str(port))
    proc = spawn(*args, "--json")
    wait_for(lambda: 'duejobs_scheduled{tenant="acme"} 1.0' in _scrape(port), 30, "the gauges")
    system.app.schedule("record", {}, delay=3600, tenant="acme")

    def passes() -> int:
        return sum(line.startswith("{") for line in proc.output().splitlines())

    seen = passes()
    wait_for(lambda: passes() >= seen + 3, 30, "three more passes")
    assert 'duejobs_scheduled{tenant="acme"} 1.0' in _scrape(port)  # not recounted
    assert proc.stop() == 0


def test_json_logs_carry_the_schedule_identity(system: System, spawn: Callable[..., Proc]) -> None:
    s = system.app.schedule("flaky", {"fail_times": 1}, delay=0, tenant="acme")
    system.scheduler.run_once()
    worker = spawn("worker", "--app", "tests.support.apps:app", "--burst", "--log-format", "json")
    assert worker.popen.wait(60) == 0
    records = [json.loads(line) for line in worker.output().splitlines() if line.startswith("{")]
    failed = [r for r in records if r.get("message", "").startswith("attempt failed")]
    assert failed, worker.output()
    assert failed[0]["schedule_id"] == str(s.id) and failed[0]["tenant"] == "acme"
    assert failed[0]["version"] == 1 and failed[0]["attempt"] == 1


def test_a_handlers_error_cannot_forge_a_line_of_the_text_log(
    system: System, spawn: Callable[..., Proc]
) -> None:
    """A handler's exception whose text holds a line break and what follows it would read as
    a log line of its own: in the text log, the message's break is escaped and the traceback's
    lines are indented, so every line at the margin is the worker's. Seen failing with the
    forged line at the margin, twice (the message, the traceback's last line)."""
    system.app.schedule("forges-a-log-line", {}, delay=0)
    system.scheduler.run_once()
    worker = spawn("worker", "--app", "tests.support.apps:app", "--burst")
    assert worker.popen.wait(60) == 0
    lines = worker.output().splitlines()
    assert not [line for line in lines if line.startswith(FORGED)], worker.output()
    assert any("a forged line" in line for line in lines), worker.output()


def test_a_read_replica_that_is_down_is_a_gauge_and_one_line_not_a_failed_pass(
    system: System, spawn: Callable[..., Proc]
) -> None:
    """The replica out of reach: each pass still does its repairs and reports them, the
    gauges say the replica is down (up 0, lag +Inf, so a lag alert fires too), and the log
    has one line per refresh, no traceback. Seen failing with a "failed" pass and a
    130-line traceback every pass, and the lag gauge frozen at 0."""
    port = free_port()
    proc = spawn(
        "reconcile",
        "--every",
        "0.5",
        "--stats-every",
        "1s",
        "--metrics-port",
        str(port),
        "--json",
        extra_env={"DUEJOBS_READ_DATABASE_URL": "postgresql://postgres:pa55word@127.0.0.1:1/x"},
    )

    def down() -> bool:
        body = _scrape(port)
        return "duejobs_read_replica_up 0.0" in body and "read_replica_lag_seconds +Inf" in body

    wait_for(down, 30, "the replica's gauges")

    def passes() -> int:
        return sum(line.startswith("{") for line in proc.output().splitlines())

    wait_for(lambda: passes() >= 3, 30, "three passes reported")
    assert proc.stop() == 0
    log = proc.output()
    assert "Traceback" not in log and "pa55word" not in log, log
    assert "stats gauges not refreshed: the read replica is unavailable" in log, log


def test_a_tracebacks_steering_characters_are_escaped_in_the_text_log() -> None:
    """A handler's error text in the traceback's last line: ESC (which would recolour or
    clear the operator's terminal), CR (which would rewrite the line shown) and U+202E (which
    would reverse what follows) are written as escapes, as in the message. Seen reaching the
    log raw."""
    try:
        raise ValueError("\x1b[2Jcleared\rrewritten \u202eesrever")
    except ValueError:
        record = logging.LogRecord("duejobs.worker", logging.WARNING, "", 0, "failed", None, None)
        record.exc_info = sys.exc_info()
    text = TextFormatter().format(record)
    assert not set(text) & {"\x1b", "\r", "\u202e"}, repr(text)
    assert "\\x1b[2Jcleared\\rrewritten \\u202eesrever" in text
    assert all(line.startswith("  ") for line in text.splitlines()[1:])


def test_invisible_and_reordering_characters_are_escaped_for_terminals_and_pages() -> None:
    """U+061C (a bidirectional mark) and U+200B (a zero-width space, which makes two keys
    that read alike differ) are shown as escapes by the CLI and the dashboard. Seen printed
    raw by both."""
    for char, escape in (("\u061c", "\\u061c"), ("\u200b", "\\u200b")):
        assert printable(f"a{char}b") == f"a{escape}b"
        assert bidi_escaped(f"a{char}b") == f"a{escape}b"


def test_a_gauge_is_exported_only_by_the_process_that_owns_it(
    system: System, spawn: Callable[..., Proc]
) -> None:
    """A worker exports no recurring-loop gauge and no reconciler gauge (at 0, the recurring
    loop would read as never run, and its alert fire on every worker); the scheduler exports
    its recurring loop's last pass once it has made one. Seen failing with every gauge
    exported by every process. (Two processes started and scraped: about 10 s.)"""
    worker_port, scheduler_port = free_port(), free_port()
    spawn("worker", "--app", "tests.support.apps:app", "--metrics-port", str(worker_port))
    spawn("scheduler", "--metrics-port", str(scheduler_port))
    wait_for(
        lambda: "duejobs_recurring_last_pass_timestamp_seconds " in _scrape(scheduler_port),
        30,
        "the scheduler's recurring loop to export its last pass",
    )
    exported = _scrape(worker_port)
    assert "duejobs_worker_batch" in exported or "duejobs_deliveries" in exported, exported
    for gauge in (
        "duejobs_recurring_last_pass_timestamp_seconds",
        "duejobs_locked_past_lease",
        "duejobs_schedules_without_job",
        "duejobs_oldest_overdue_seconds",
        "duejobs_read_replica_up",
    ):
        assert f"\n{gauge} " not in exported, gauge
