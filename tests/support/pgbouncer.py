"""A real PgBouncer in front of the test session's PostgreSQL, started by the tests that need
one, as teams deploy it: Debian's ``pgbouncer`` (1.18 on Debian 12), in transaction or session
mode, on a loopback port, its server connections few so that its clients share them.

``make test`` installs Debian's package when it is missing and the machine allows it
(``make pgbouncer``); where there is none, the tests using :func:`start_pgbouncer` are skipped,
saying so.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from psycopg.conninfo import conninfo_to_dict

# Where Debian's package puts it (not on a plain user's PATH).
_BINARIES = ("/usr/sbin/pgbouncer", "/usr/bin/pgbouncer")


def pgbouncer_binary() -> str | None:
    """PgBouncer's program, or None where it is not installed."""
    found = shutil.which("pgbouncer")
    return found or next((b for b in _BINARIES if os.access(b, os.X_OK)), None)


@dataclass
class PgBouncer:
    """A running PgBouncer: ``url_for(database)`` reaches a database of the server through
    it; ``restart()`` stops it at once (every client's connection dropped) and starts it again
    on the same port; ``stop()`` ends it."""

    port: int
    mode: str
    folder: Path
    popen: subprocess.Popen[bytes]
    argv: list[str]
    user: str | None

    def url_for(self, database: str) -> str:
        return f"postgresql://duejobs:secret-pw@127.0.0.1:{self.port}/{database}"

    def log(self) -> str:
        path = self.folder / "pgbouncer.log"
        return path.read_text(errors="replace") if path.exists() else "(no log)"

    def restart(self) -> None:
        self.stop()
        self._start()

    def stop(self) -> None:
        if self.popen.poll() is None:
            self.popen.send_signal(signal.SIGINT)  # immediate shutdown: clients dropped
            try:
                self.popen.wait(10)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait()

    def _start(self) -> None:
        self.popen = subprocess.Popen(self.argv, user=self.user, stdout=subprocess.DEVNULL)
        _wait_for_port(self.port, self.popen, self)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait_for_port(port: int, popen: subprocess.Popen[bytes], bouncer: PgBouncer | None) -> None:
    deadline = time.monotonic() + 30
    while True:
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 1):
            return
        if popen.poll() is not None or time.monotonic() > deadline:
            log = bouncer.log() if bouncer else ""
            raise RuntimeError(f"PgBouncer did not start (exit {popen.poll()}):\n{log[-3000:]}")
        time.sleep(0.05)


def _server_of(libpq_url: str) -> str:
    """The ``[databases]`` line's connection string for the server a libpq URL names: its
    host (a socket folder or an address), port and user (any database name is passed on)."""
    parts = conninfo_to_dict(libpq_url)
    fields = {
        "host": parts.get("host") or "/var/run/postgresql",
        "port": parts.get("port") or "5432",
        "user": parts.get("user") or "postgres",
    }
    if parts.get("password"):
        fields["password"] = parts["password"]
    return " ".join(f"{k}={v}" for k, v in fields.items())


@contextlib.contextmanager
def start_pgbouncer(
    server_url: str, mode: str = "transaction", pool_size: int = 3
) -> Iterator[PgBouncer]:
    """PgBouncer in ``mode`` in front of the server ``server_url`` (a libpq URL) names, with
    ``pool_size`` server connections per database: any client name and password is let in
    and logs in as the URL's user. Its files are in a folder of its own under the system's
    temporary directory (readable by the user it runs as), removed at the end. Skips the test
    where PgBouncer is not installed."""
    binary = pgbouncer_binary()
    if binary is None:
        pytest.skip("PgBouncer is not installed here (make pgbouncer: Debian's package)")
    folder = Path(tempfile.mkdtemp(prefix="duejobs-pgbouncer-"))
    port = _free_port()
    config = folder / "pgbouncer.ini"
    config.write_text(
        "[databases]\n"
        f"* = {_server_of(server_url)}\n"
        "[pgbouncer]\n"
        f"listen_addr = 127.0.0.1\nlisten_port = {port}\nunix_socket_dir =\n"
        f"logfile = {folder / 'pgbouncer.log'}\npidfile = {folder / 'pgbouncer.pid'}\n"
        f"auth_type = any\npool_mode = {mode}\n"
        f"default_pool_size = {pool_size}\nmin_pool_size = 0\nreserve_pool_size = 0\n"
        "max_client_conn = 1000\nserver_reset_query_always = 0\n"
        "ignore_startup_parameters = extra_float_digits\n"
    )
    user = None
    if os.getuid() == 0:  # PgBouncer refuses to run as root
        user = _runs_as(server_url)
        owner = pwd.getpwnam(user)
        os.chown(folder, owner.pw_uid, owner.pw_gid)
        for path in folder.iterdir():
            os.chown(path, owner.pw_uid, owner.pw_gid)
    argv = [binary, "-q", str(config)]  # -q: its log to the file only
    popen = subprocess.Popen(argv, user=user, stdout=subprocess.DEVNULL)
    bouncer = PgBouncer(port, mode, folder, popen, argv, user)
    try:
        _wait_for_port(port, popen, bouncer)
        yield bouncer
    finally:
        bouncer.stop()
        shutil.rmtree(folder, ignore_errors=True)


def _runs_as(server_url: str) -> str:
    """The user PgBouncer runs as when the tests run as root: the owner of the server's socket
    folder (the embedded server's own user, whose folder is closed to others), else
    ``postgres`` or ``nobody``."""
    host = conninfo_to_dict(server_url).get("host") or ""
    if host.startswith("/") and os.path.isdir(host):
        owner = os.stat(host).st_uid
        if owner != 0:
            return pwd.getpwuid(owner).pw_name
    for name in ("postgres", "nobody"):
        with contextlib.suppress(KeyError):
            return pwd.getpwnam(name).pw_name
    raise RuntimeError("no user to run PgBouncer as (it refuses root)")
