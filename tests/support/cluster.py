"""A Redis Cluster of a test's own: three masters, each with a replica, six server processes
(``cluster-enabled``) on loopback ports at most 55535 (each node's cluster bus listens 10000
above its port), nothing persisted. Made with the servers' own commands (``CLUSTER MEET``,
``ADDSLOTSRANGE``, ``REPLICATE``), so no ``redis-cli`` is needed to start one."""

from __future__ import annotations

import contextlib
import random
import signal
import subprocess
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path

import redis
from redis.cluster import ClusterNode, RedisCluster

from duejobs.delivery import Push
from duejobs.models import Delivery
from tests.support import wait_for
from tests.support.deliveries import job_id
from tests.support.network import listening

SLOTS = 16384
# Six queues whose hash tags fall on all three masters of an evenly split cluster.
QUEUES = ("mail", "sms", "payments", "billing", "followups", "webhooks")
# A node's cluster bus listens on its port + 10000: both must be valid ports.
HIGHEST_PORT = 55535
_BUS = 10000


class PortTaken(RuntimeError):
    """A server could not start on its port (another process took it meanwhile)."""


@dataclass
class ClusterServer:
    """One server of the cluster, on a fixed port."""

    binary: str
    port: int
    folder: Path
    process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        """Started empty, its cluster configuration forgotten (a restart joins as new)."""
        self.folder.mkdir(parents=True, exist_ok=True)
        (self.folder / "nodes.conf").unlink(missing_ok=True)
        args = [self.binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", ""]
        args += ["--appendonly", "no", "--dir", str(self.folder), "--cluster-enabled", "yes"]
        args += ["--cluster-config-file", "nodes.conf", "--cluster-node-timeout", "1000"]
        args += ["--logfile", str(self.folder / "server.log")]
        self.process = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_for(lambda: self.answers() or self.process_ended(), 20, f"port {self.port}")
        if self.process_ended():
            log = (self.folder / "server.log").read_text(errors="replace")
            raise PortTaken(f"the server on port {self.port} ended: {log[-500:]}")

    def process_ended(self) -> bool:
        return self.process is not None and self.process.poll() is not None

    def answers(self) -> bool:
        with contextlib.suppress(redis.RedisError), self.client() as client:
            return bool(client.ping())
        return False

    def client(self) -> redis.Redis:
        return redis.Redis(port=self.port, socket_timeout=5)

    def node_id(self) -> str:
        with self.client() as client:
            return str(client.execute_command("CLUSTER", "MYID").decode())

    def kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait()


@dataclass
class Cluster:
    """Three masters (slots split evenly) and a replica of each."""

    servers: list[ClusterServer]  # the three masters as made, then their replicas
    clients: list[RedisCluster] = field(default_factory=list)

    @property
    def url(self) -> str:
        hosts = ",".join(f"127.0.0.1:{s.port}" for s in self.servers[:3])
        return f"redis+cluster://{hosts}"

    def client(self) -> RedisCluster:
        """A cluster client (closed with the cluster)."""
        made = RedisCluster(
            startup_nodes=[ClusterNode("127.0.0.1", s.port) for s in self.servers[:3]],
            socket_timeout=5,
        )
        self.clients.append(made)
        return made

    def make(self) -> None:
        """The servers started, met, given their slots and their replicas; returns once every
        server says the cluster is ``ok`` and sees all six."""
        for server in self.servers:
            server.start()
        first = self.servers[0].client()
        for server in self.servers[1:]:
            first.execute_command("CLUSTER", "MEET", "127.0.0.1", server.port)
        wait_for(lambda: all(_known(s) == len(self.servers) for s in self.servers), 30, "MEET")
        step = SLOTS // 3
        for i, master in enumerate(self.servers[:3]):
            last = SLOTS - 1 if i == 2 else (i + 1) * step - 1
            with master.client() as client:
                client.execute_command("CLUSTER", "ADDSLOTSRANGE", i * step, last)
        ids = [master.node_id() for master in self.servers[:3]]
        wait_for(lambda: all(_assigned(s) == SLOTS for s in self.servers), 30, "the slots")
        for replica, master_id in zip(self.servers[3:], ids, strict=True):
            with replica.client() as client:
                client.execute_command("CLUSTER", "REPLICATE", master_id)
        wait_for(self.healthy, 60, "the cluster to be ok with a replica of each master")
        first.close()

    def healthy(self) -> bool:
        """Every server answers and says ``cluster_state:ok``; three masters, each with a
        replica."""
        try:
            for server in self.servers:
                with server.client() as client:
                    if client.execute_command("CLUSTER", "INFO").decode().find("state:ok") < 0:
                        return False
            with self.servers[0].client() as client:
                nodes = client.execute_command("CLUSTER", "NODES").decode().splitlines()
        except redis.RedisError:
            return False
        roles = [flag for node in nodes for flag in node.split()[2].split(",")]
        return roles.count("master") == 3 and roles.count("slave") == 3

    def stop(self) -> None:
        for made in self.clients:
            made.close()
        for server in self.servers:
            server.kill()


def _known(server: ClusterServer) -> int:
    with server.client() as client:
        return len(client.execute_command("CLUSTER", "NODES").decode().splitlines())


def _assigned(server: ClusterServer) -> int:
    with server.client() as client:
        info = client.execute_command("CLUSTER", "INFO").decode()
    fields = dict(line.split(":", 1) for line in info.split() if ":" in line)
    return int(fields["cluster_slots_assigned"])


def cluster_ports(n: int) -> list[int]:
    """``n`` ports at most :data:`HIGHEST_PORT` on which nothing listens, nor on their bus
    ports (drawn at random, so that test processes side by side rarely draw the same)."""
    found: list[int] = []
    while len(found) < n:
        port = random.randint(20000, HIGHEST_PORT)
        taken = {p for q in found for p in (q, q + _BUS)}
        if {port, port + _BUS} & taken or listening(port) or listening(port + _BUS):
            continue
        found.append(port)
    return found


@contextlib.contextmanager
def cluster(binary: str, folder: Path) -> Iterator[Cluster]:
    """Three masters and three replicas, made and stopped at the end (made again on other
    ports, up to three times, when a port was taken between its draw and its server's start)."""
    for attempt in range(3):
        made = Cluster([ClusterServer(binary, p, folder / str(p)) for p in cluster_ports(6)])
        try:
            made.make()
            break
        except PortTaken:
            made.stop()
            if attempt == 2:
                raise
    try:
        yield made
    finally:
        made.stop()


def push_due(queue: str, due_in: float, priority: int = 0, tenant: str = "acme") -> Push:
    """A push of a new delivery on ``queue``, due ``due_in`` seconds from now."""
    sid = uuid.uuid4()
    due = datetime.now(UTC) + timedelta(seconds=due_in)
    return Push(Delivery(sid, tenant, 1, 1, queue, due, job_id(tenant, sid, 1, 1), priority))
