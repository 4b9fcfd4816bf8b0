"""CPU time spent by each side of a peer benchmark: its own processes (with their children) and
the servers it stands on, read at two instants so that start-up and idle waiting are left out.

* A process tree: each live process's user + system time, plus what its reaped children spent.
* PostgreSQL: the postmaster's tree, found from a backend's pid (needs the server on this
  machine; otherwise not measured, and said so).
* Redis: its own ``INFO cpu`` (every thread of the server).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

import psutil
import psycopg
from redis import Redis


def tree_seconds(pid: int) -> float:
    """CPU seconds of a process, its live descendants and the children it has reaped."""
    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return 0.0
    total = 0.0
    for proc in procs:
        try:
            t = proc.cpu_times()
        except psutil.NoSuchProcess:
            continue
        total += t.user + t.system + t.children_user + t.children_system
    return total


def postgres_reader(url: str) -> Callable[[], float] | None:
    """A reader of the PostgreSQL server's CPU seconds (its postmaster's tree), or None when
    the server's processes cannot be seen from here."""
    with psycopg.connect(url) as conn:
        row = conn.execute("SELECT pg_backend_pid()").fetchone()
    assert row is not None
    try:
        postmaster = psutil.Process(int(row[0])).parent()
    except psutil.Error:
        return None
    if postmaster is None:
        return None
    pid = postmaster.pid
    return lambda: tree_seconds(pid)


def redis_seconds(client: Redis) -> float:
    """CPU seconds the Redis server has spent (user + system, every thread)."""
    cpu = client.info("cpu")
    return float(cpu["used_cpu_user"]) + float(cpu["used_cpu_sys"])


@dataclass(frozen=True)
class Reading:
    """CPU seconds by part at one instant."""

    parts: dict[str, float]

    def since(self, before: Reading) -> dict[str, float]:
        return {name: value - before.parts.get(name, 0.0) for name, value in self.parts.items()}


@dataclass
class Meter:
    """The parts of one side: its processes (pids) and the servers it uses."""

    redis: Redis
    postgres: Callable[[], float] | None = None
    pids: tuple[int, ...] = ()

    def with_pids(self, pids: Iterable[int]) -> Meter:
        return Meter(self.redis, self.postgres, tuple(pids))

    def read(self) -> Reading:
        parts = {
            "processes": sum(tree_seconds(pid) for pid in self.pids),
            "redis": redis_seconds(self.redis),
        }
        if self.postgres is not None:
            parts["postgres"] = self.postgres()
        return Reading(parts)
