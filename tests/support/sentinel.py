"""Redis as teams run it highly available, started by the tests themselves: a master, a
replica and three Sentinels (the server binary in ``--sentinel`` mode), on loopback ports
of their own, nothing persisted. A test kills the master, waits for the Sentinels to
promote the replica, and starts the old master again (the Sentinels make it a replica)."""

from __future__ import annotations

import contextlib
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import redis

from tests.support import wait_for
from tests.support.network import free_ports
from tests.support.valkey import Node

SERVICE = "duejobs"


@dataclass
class Sentinels:
    """The master, its replica and three Sentinels watching them."""

    binary: str
    folder: Path
    servers: list[Node]  # [master, replica] as started; a failover swaps their roles
    ports: list[int]
    processes: list[subprocess.Popen[bytes]] = field(default_factory=list)

    @property
    def url(self) -> str:
        hosts = ",".join(f"127.0.0.1:{port}" for port in self.ports)
        return f"redis+sentinel://{hosts}/{SERVICE}/0"

    def start(self) -> None:
        master, replica = self.servers
        master.start()
        replica.start(replica_of=master.port)
        for port in self.ports:
            conf = self.folder / f"sentinel-{port}.conf"
            conf.write_text(
                f"port {port}\nbind 127.0.0.1\ndir {self.folder}\n"
                f"sentinel monitor {SERVICE} 127.0.0.1 {master.port} 2\n"
                f"sentinel down-after-milliseconds {SERVICE} 1000\n"
                f"sentinel failover-timeout {SERVICE} 5000\n"
            )
            self.processes.append(
                subprocess.Popen(
                    [self.binary, str(conf), "--sentinel"],
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                )
            )
        wait_for(lambda: self.master_port() == master.port, 30, "the Sentinels to see the master")
        wait_for(lambda: self._replicas() >= 1, 30, "the Sentinels to see the replica")

    def master_port(self) -> int | None:
        """The master's port as the first Sentinel that answers names it."""
        for port in self.ports:
            with contextlib.suppress(redis.RedisError), redis.Redis(port=port) as sentinel:
                found = sentinel.sentinel_get_master_addr_by_name(SERVICE)
                if found:
                    return int(found[1])
        return None

    def _replicas(self) -> int:
        with redis.Redis(port=self.ports[0]) as sentinel:
            return sum(not r.get("is_sdown") for r in sentinel.sentinel_slaves(SERVICE))

    def master(self) -> Node:
        port = self.master_port()
        return next(node for node in self.servers if node.port == port)

    def fail_over(self) -> float:
        """SIGKILL to the master; once a Sentinel names the promoted replica, the old master
        started again (empty) as its replica — as its configuration, rewritten by the
        Sentinels, would start it (left to the Sentinels to convert, a restarted master took
        over a minute on a loaded machine). The time.time() the new master was named."""
        old = self.master()
        old.kill()
        wait_for(lambda: self.master_port() not in (None, old.port), 60, "a promotion")
        promoted = time.time()
        new = self.master_port()
        assert new is not None
        old.start(replica_of=new)
        with old.client() as client:
            wait_for(lambda: client.info("replication")["role"] == "slave", 60, "the old master")
        wait_for(lambda: self._replicas() >= 1, 60, "the Sentinels to see it a replica")
        return promoted

    def stop(self) -> None:
        for process in self.processes:
            process.kill()
            process.wait()
        for node in self.servers:
            node.kill()


@contextlib.contextmanager
def sentinels(binary: str, folder: Path) -> Iterator[Sentinels]:
    """A master, a replica and three Sentinels, stopped at the end."""
    ports = free_ports(5)
    made = Sentinels(
        binary, folder, [Node(binary, p, folder / str(p)) for p in ports[:2]], ports[2:]
    )
    for node in made.servers:
        node.folder.mkdir(parents=True, exist_ok=True)
    try:
        made.start()
        yield made
    finally:
        made.stop()


@dataclass
class OneSentinel:
    """A master and one Sentinel watching it (quorum 1), the Sentinel's password optional:
    enough to ask it the wrong things."""

    master: Node
    port: int
    process: subprocess.Popen[bytes]

    def url(self, service: str = SERVICE, query: str = "") -> str:
        return f"redis+sentinel://127.0.0.1:{self.port}/{service}/0{query}"

    def client(self, password: str | None = None) -> redis.Redis:
        return redis.Redis(port=self.port, password=password, socket_timeout=5)


@contextlib.contextmanager
def one_sentinel(binary: str, folder: Path, password: str | None = None) -> Iterator[OneSentinel]:
    """A master and one Sentinel (``password``: its ``requirepass``), stopped at the end."""
    master_port, port = free_ports(2)
    master = Node(binary, master_port, folder / str(master_port))
    master.folder.mkdir(parents=True, exist_ok=True)
    master.start()
    conf = folder / f"sentinel-{port}.conf"
    conf.write_text(
        f"port {port}\nbind 127.0.0.1\ndir {folder}\n"
        f"sentinel monitor {SERVICE} 127.0.0.1 {master_port} 1\n"
        + (f"requirepass {password}\n" if password else "")
    )
    process = subprocess.Popen(
        [binary, str(conf), "--sentinel"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    made = OneSentinel(master, port, process)
    try:
        asking = made.client(password)
        wait_for(lambda: _knows(asking, SERVICE), 30, "the Sentinel to answer and watch the master")
        yield made
    finally:
        process.kill()
        process.wait()
        master.kill()


def _knows(client: redis.Redis, service: str) -> bool:
    with contextlib.suppress(redis.RedisError):
        return service in client.sentinel_masters()
    return False
