"""A Redis Cluster of a test's own: three masters (or as many as asked), each with a replica,
every server (``cluster-enabled``) on loopback ports at most 55535 (each node's cluster bus
listens 10000 above its port), nothing persisted. Made with the servers' own commands
(``CLUSTER MEET``, ``ADDSLOTSRANGE``, ``REPLICATE``), so no ``redis-cli`` is needed to start
one."""

from __future__ import annotations

import contextlib
import random
import signal
import subprocess
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path

import redis
from redis.cluster import ClusterNode, RedisCluster
from redis.crc import key_slot

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

    def start(self, keep_config: bool = False) -> None:
        """Started empty, its cluster configuration forgotten (a restart joins as new) —
        or, with ``keep_config``, kept (a restart rejoins as the node it was)."""
        self.folder.mkdir(parents=True, exist_ok=True)
        if not keep_config:
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
    """Masters (three by default, slots split evenly) and a replica of each."""

    servers: list[ClusterServer]  # the masters as made, then their replicas
    masters: int = 3
    clients: list[RedisCluster] = field(default_factory=list)

    @property
    def url(self) -> str:
        hosts = ",".join(f"127.0.0.1:{s.port}" for s in self.servers[: self.masters])
        return f"redis+cluster://{hosts}"

    def client(self) -> RedisCluster:
        """A cluster client (closed with the cluster)."""
        made = RedisCluster(
            startup_nodes=[ClusterNode("127.0.0.1", s.port) for s in self.servers[: self.masters]],
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
        n = self.masters
        step = SLOTS // n
        for i, master in enumerate(self.servers[:n]):
            last = SLOTS - 1 if i == n - 1 else (i + 1) * step - 1
            with master.client() as client:
                client.execute_command("CLUSTER", "ADDSLOTSRANGE", i * step, last)
        ids = [master.node_id() for master in self.servers[:n]]
        wait_for(lambda: all(_assigned(s) == SLOTS for s in self.servers), 30, "the slots")
        for replica, master_id in zip(self.servers[n:], ids, strict=True):
            with replica.client() as client:
                client.execute_command("CLUSTER", "REPLICATE", master_id)
        wait_for(self.healthy, 60, "the cluster to be ok with a replica of each master")
        first.close()

    def healthy(self) -> bool:
        """Every server answers and says ``cluster_state:ok``; its masters, each with a
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
        if roles.count("master") != self.masters or roles.count("slave") != self.masters:
            return False
        # A replica that never synced with its master cannot be promoted in its place.
        return all(_synced(replica) for replica in self.servers[self.masters :])

    def master_of(self, queue: str) -> ClusterServer:
        """The server that serves ``queue``'s slot now (its hash tag's)."""
        slot = key_slot(f"{{{queue}}}".encode())
        for server in self.servers:
            if server.process_ended():
                continue
            with contextlib.suppress(redis.RedisError), server.client() as client:
                for start, end, (_host, port, *_rest), *_replicas in client.execute_command(
                    "CLUSTER", "SLOTS"
                ):
                    if start <= slot <= end:
                        return next(s for s in self.servers if s.port == int(port))
        raise AssertionError(f"no server answers for {queue!r}'s slot")

    def kill_master_of(self, queue: str) -> float:
        """SIGKILL to the master of ``queue``; returns the time.time() at which the cluster
        names its replica master and says it is ``ok`` again."""
        old = self.master_of(queue)
        old.kill()
        wait_for(lambda: self._served_by_other(queue, old), 60, "the replica's promotion")
        return time.time()

    def promote_replica_of(self, queue: str, flush: bool = False) -> float:
        """The replica of ``queue``'s master made master by hand (``CLUSTER FAILOVER``), then,
        with ``flush``, emptied (a replica that had fallen far behind); the time.time() at
        which it serves."""
        old = self.master_of(queue)
        replica = next(s for s in self.servers if s is not old and _replica_of(s, old))
        with replica.client() as client:
            client.execute_command("CLUSTER", "FAILOVER")
        wait_for(lambda: self._served_by_other(queue, old), 60, "the manual failover")
        if flush:
            with replica.client() as client:
                client.flushall()
        return time.time()

    def kill_all(self) -> None:
        """Every server SIGKILLed at once: the whole cluster away."""
        for server in self.servers:
            server.kill()

    def start_again(self) -> float:
        """Every server started again empty (no persistence), each as the node it was; the
        time.time() at which the cluster is whole again."""
        for server in self.servers:
            server.start(keep_config=True)
        wait_for(self.healthy, 60, "the cluster whole again after its restart")
        return time.time()

    def restart_all(self, away: float) -> float:
        """The whole cluster away for ``away`` seconds, then whole again (:meth:`start_again`'s
        time)."""
        self.kill_all()
        time.sleep(away)  # the outage itself, not a wait for a result
        return self.start_again()

    def reshard_away(self, queue: str, cli: str) -> float:
        """``queue``'s slot, and the slots before it on its master, migrated to another
        master with ``redis-cli --cluster reshard`` (``cli``); the time.time() it ended."""
        old = self.master_of(queue)
        masters = self.servers[: self.masters]
        to = next(s for s in masters if s is not old and not s.process_ended())
        slot = key_slot(f"{{{queue}}}".encode())
        with old.client() as client:
            first = min(
                start
                for start, end, (_h, port, *_r), *_ in client.execute_command("CLUSTER", "SLOTS")
                if int(port) == old.port and start <= slot
            )
        subprocess.run(
            [
                *(cli, "--cluster", "reshard", f"127.0.0.1:{old.port}"),
                *("--cluster-from", old.node_id(), "--cluster-to", to.node_id()),
                *("--cluster-slots", str(slot - first + 1), "--cluster-yes"),
            ],
            check=True,
            capture_output=True,
            timeout=120,
        )
        wait_for(lambda: self._served_by_other(queue, old), 60, "the slot's new master")
        return time.time()

    def _served_by_other(self, queue: str, old: ClusterServer) -> bool:
        with contextlib.suppress(AssertionError, redis.RedisError):
            now = self.master_of(queue)
            with now.client() as client:
                ok = "cluster_state:ok" in client.execute_command("CLUSTER", "INFO").decode()
            return now is not old and ok
        return False

    def stop(self) -> None:
        for made in self.clients:
            made.close()
        for server in self.servers:
            server.kill()


def _synced(replica: ClusterServer) -> bool:
    with replica.client() as client:
        return client.info("replication").get("master_link_status") == "up"


def _replica_of(server: ClusterServer, master: ClusterServer) -> bool:
    with contextlib.suppress(redis.RedisError), server.client() as client:
        info = client.info("replication")
        return info.get("role") == "slave" and int(info.get("master_port", 0)) == master.port
    return False


def _known(server: ClusterServer) -> int:
    with server.client() as client:
        return len(client.execute_command("CLUSTER", "NODES").decode().splitlines())


def _assigned(server: ClusterServer) -> int:
    with server.client() as client:
        info = client.execute_command("CLUSTER", "INFO").decode()
    fields = dict(line.split(":", 1) for line in info.split() if ":" in line)
    return int(fields["cluster_slots_assigned"])


def _below_ephemeral() -> int:
    """The highest port below the kernel's range for outgoing connections' own ports (a
    server cannot listen on a port a connection of the machine holds as its own)."""
    with contextlib.suppress(OSError, ValueError):
        low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
        return min(HIGHEST_PORT, low - 1)
    return HIGHEST_PORT


def cluster_ports(n: int) -> list[int]:
    """``n`` ports at most :data:`HIGHEST_PORT`, they and their bus ports below the ports the
    kernel gives outgoing connections, on which nothing listens (drawn at random, so that test
    processes side by side rarely draw the same)."""
    highest = _below_ephemeral() - _BUS
    found: list[int] = []
    while len(found) < n:
        port = random.randint(min(10000, highest - 1000), highest)
        taken = {p for q in found for p in (q, q + _BUS)}
        if {port, port + _BUS} & taken or listening(port) or listening(port + _BUS):
            continue
        found.append(port)
    return found


@contextlib.contextmanager
def cluster(binary: str, folder: Path, masters: int = 3) -> Iterator[Cluster]:
    """Three masters and three replicas, made and stopped at the end (made again on other
    ports, up to three times, when a port was taken between its draw and its server's start)."""
    for attempt in range(3):
        ports = cluster_ports(2 * masters)
        made = Cluster([ClusterServer(binary, p, folder / str(p)) for p in ports], masters)
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
