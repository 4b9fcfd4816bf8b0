"""Fault injection: `python -m bench chaos [SEED ...]` (CHAOS_SCHEDULES, CHAOS_SECONDS,
CHAOS_NODES).

A seeded plan of schedules — one-offs due now and over the run, retried ones, slow ones,
recurring definitions, reschedules and cancels made while it runs — is served by real
processes (two schedulers, four workers, a reconciler) on a PostgreSQL and a Redis of the
run's own, while faults are injected in a seeded order: SIGKILL of schedulers, workers and
reconcilers (each restarted), a job popped and left behind as a killed worker would between
Redis and its claim, Redis flushed, Redis restarted (no persistence: every key lost),
PostgreSQL restarted or crashed, job hashes, queue entries and scheduled-registry members
deleted, (in partitioned mode, ``ChaosConfig.partitioned``) the partitions made ahead
dropped, one
PostgreSQL connection or every one terminated, a scheduler paused with SIGSTOP. With several
Redis nodes (``ChaosConfig.nodes``: queue ``duejobs`` on the first, ``chaos-1``, ``chaos-2``,
... each on one more, through ``DUEJOBS_REDIS_NODES``; the schedules spread over them, each
worker serving one), every Redis fault lands on one node, and one more is injected: a node
killed and started again, empty, a few seconds later (``node-down``); after the seeds,
``bench.node_outage`` measures what one node down costs the queues on the others (their
start-lag p99 during the outage over their p99 before it, at most 1.2). A process
that exits on its own (an RQ worker that meets Redis gone at a moment RQ does not retry) is
started again, as its supervisor would, and counted. Then it checks, by the database:

* every schedule that was due ran to a terminal state;
* each (schedule, version) effect was applied at most once (through ``ctx.transaction()``),
  and every ``succeeded`` schedule has exactly its one;
* none started before its due time (the database's clock);
* none cancelled or superseded ran;
* the rate limits in force (tenant ``initech`` 5/s, the default queue 30/s) let at most N + 1
  attempts start in any second;
* after the last fault, everything due was terminal within ``recovery_bound``.

It prints the schedules, the faults by kind, the violations (must be 0) and the recovery
time, and exits 1 on any violation. The PostgreSQL restart is a fast shutdown and a start;
what is not injected is a crash that loses acknowledged commits (the workers'
``synchronous_commit = off`` caveat; see the worker).
"""

from __future__ import annotations

import contextlib
import itertools
import os
import random
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg
import redis

import duejobs
from bench.chaos_app import EFFECTS
from duejobs import store
from duejobs.config import libpq_url, sqlalchemy_url
from duejobs.core import make_engine
from duejobs.dev.embedded import EmbeddedRedis
from duejobs.errors import DuejobsError
from duejobs.rates import parse_rate
from duejobs.rq_wire.bands import band_queue
from duejobs.rq_wire.keys import QUEUES_KEY
from duejobs.store.migrate import upgrade
from duejobs.store.partitions import PARTITIONED, Partitioning, partition_name

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_QUEUE = "duejobs"
LEASE = "6s"  # workers' lease, so that rescues fit a short run


@dataclass(frozen=True)
class ChaosConfig:
    """The size of a run; the defaults are the benchmark's."""

    seed: int = 1
    # Within what the workers carry between faults, so that what the run measures is
    # recovery, not a backlog the plan itself built up.
    schedules: int = 1200
    fault_seconds: float = 60.0  # and longer, until every kind was injected once
    fault_gap: tuple[float, float] = (0.3, 1.5)
    schedulers: int = 2
    workers: int = 4
    recurring: int = 4
    recovery_bound: float = 60.0
    settle_timeout: float = 180.0
    # Partitioned mode (daily partitions), with one more fault: the coming partitions dropped.
    partitioned: bool = False
    # Redis nodes, a queue on each; with more than one, one more fault: a node down a while.
    nodes: int = 1

    @property
    def queues(self) -> list[str]:
        """The run's queues, the i-th on the i-th node."""
        return [DEFAULT_QUEUE, *(f"chaos-{i}" for i in range(1, self.nodes))]


@dataclass
class ChaosReport:
    """What a run did and found."""

    seed: int
    schedules: int = 0
    faults: Counter[str] = field(default_factory=Counter)
    actions: Counter[str] = field(default_factory=Counter)
    # Processes that exited on their own and were started again (as a supervisor would).
    exits: Counter[str] = field(default_factory=Counter)
    violations: dict[str, int] = field(default_factory=dict)
    states: dict[str, int] = field(default_factory=dict)
    recovery_seconds: float | None = None
    worst_start_lag: float = 0.0  # seconds from due time to start, any attempt, whole run
    # What was still live 15 s after the last fault (to see why, when recovery is slow).
    slow: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not any(self.violations.values())

    def lines(self) -> list[str]:
        recovered = "never" if self.recovery_seconds is None else f"{self.recovery_seconds:.1f} s"
        return [
            f"seed {self.seed}: {self.schedules} schedules "
            f"({', '.join(f'{k} {v}' for k, v in sorted(self.states.items()))})",
            f"  faults: {sum(self.faults.values())} "
            f"({', '.join(f'{k} {v}' for k, v in sorted(self.faults.items()))})",
            "  changes in flight: "
            + ", ".join(f"{k} {v}" for k, v in sorted(self.actions.items())),
            f"  processes that exited on their own, started again: {sum(self.exits.values())}"
            + "".join(f" ({k} {v})" for k, v in sorted(self.exits.items())),
            f"  violations: {sum(self.violations.values())} "
            f"({', '.join(f'{k} {v}' for k, v in self.violations.items())})",
            f"  everything due was terminal {recovered} after the last fault; "
            f"worst start lag during the run {self.worst_start_lag:.1f} s",
            *(f"  still live 15 s after the last fault: {row}" for row in self.slow[:10]),
        ]


class _Cluster:
    """The duejobs processes of a run, each restartable, their output in files."""

    def __init__(self, env: dict[str, str], logs: Path, config: ChaosConfig) -> None:
        self.env = env
        self.logs = logs
        self.commands = {
            "scheduler": ["scheduler", "--poll-interval", "50ms", "--log-level", "warning"],
            "worker": [
                "worker",
                "--app",
                "bench.chaos_app:app",
                "--lease",
                LEASE,
                "--heartbeat",
                "1s",
                "--log-level",
                "warning",
            ],
            "reconciler": [
                "reconcile",
                "--every",
                "1s",
                "--partitions-every",
                "1s",
                "--log-level",
                "warning",
            ],
        }
        self.queues = config.queues
        counts = {"scheduler": config.schedulers, "worker": config.workers, "reconciler": 1}
        self.procs: dict[str, list[subprocess.Popen[bytes]]] = {
            kind: [self._start(kind, i) for i in range(n)] for kind, n in counts.items()
        }

    def _start(self, kind: str, index: int) -> subprocess.Popen[bytes]:
        out = open(self.logs / f"{kind}-{index}.log", "ab")  # noqa: SIM115 - the child keeps it
        command = self.commands[kind]
        if kind == "worker":  # a worker serves the queues of one node: worker i, queue i % n
            command = [*command, "--queue", self.queues[index % len(self.queues)]]
        return subprocess.Popen(
            [sys.executable, "-m", "duejobs", *command],
            env=self.env,
            cwd=ROOT,
            stdout=out,
            stderr=subprocess.STDOUT,
        )

    def kill(self, kind: str, rng: random.Random) -> None:
        index = rng.randrange(len(self.procs[kind]))
        proc = self.procs[kind][index]
        proc.kill()
        proc.wait(30)
        self.procs[kind][index] = self._start(kind, index)

    def revive(self) -> list[str]:
        """Start again every process that exited on its own, as its supervisor would (compose
        ``restart: unless-stopped``); the kinds of those restarted."""
        revived = []
        for kind, procs in self.procs.items():
            for index, proc in enumerate(procs):
                if proc.poll() is not None:
                    procs[index] = self._start(kind, index)
                    revived.append(kind)
        return revived

    def pause(self, kind: str, rng: random.Random, seconds: float) -> None:
        proc = self.procs[kind][rng.randrange(len(self.procs[kind]))]
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(signal.SIGSTOP)

        def resume() -> None:
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signal.SIGCONT)

        threading.Timer(seconds, resume).start()

    def stop(self) -> None:
        every = [p for procs in self.procs.values() for p in procs]
        for proc in every:
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signal.SIGCONT)
                proc.send_signal(signal.SIGTERM)
        for proc in every:
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(15)


class Servers:
    """A PostgreSQL and ``nodes`` Redis servers of the run's own (the embedded ones, in a
    folder of its own), so that restarting them is real and touches nothing else. Each keeps
    its address across a restart: PostgreSQL its socket, a Redis its port. ``postgres=False``:
    the Redis servers alone."""

    def __init__(
        self, folder: Path, *, partitioned: bool = False, nodes: int = 1, postgres: bool = True
    ) -> None:
        self._postgres_dir = folder / "postgres"
        self._holder: subprocess.Popen[str] | None = None
        self.database_url = ""  # postgres=False: Redis servers only
        if postgres:
            self._holder, self.database_url = self._start_postgres()
            engine = make_engine(sqlalchemy_url(self.database_url))
            upgrade(engine, partitioned=DAILY if partitioned else None)
            engine.dispose()
        self._redis_binary = EmbeddedRedis.binary()
        self._redis_dir = folder / "redis"
        self._redis_dir.mkdir(parents=True, exist_ok=True)
        self._ports = [_free_port() for _ in range(nodes)]
        self.redis_urls = [f"redis://127.0.0.1:{port}/0" for port in self._ports]
        self.redis_url = self.redis_urls[0]
        self._redis = [self._start_redis(i) for i in range(nodes)]
        self._down: dict[int, threading.Timer] = {}  # nodes killed a while, their restarts
        self._lock = threading.Lock()

    def _start_redis(self, node: int) -> subprocess.Popen[bytes]:
        port = str(self._ports[node])
        args = [self._redis_binary, "--port", port, "--bind", "127.0.0.1", "--save", ""]
        args += ["--appendonly", "no", "--dir", str(self._redis_dir), "--dbfilename", port]
        proc = subprocess.Popen(
            args,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        client = redis.Redis(port=self._ports[node])
        if not _wait(lambda: _answers(client), 20):
            proc.kill()
            raise RuntimeError(f"Redis on port {port} did not answer 20 s after its start")
        return proc

    def up(self) -> list[int]:
        """The nodes not taken down by :meth:`take_down` (a restart's short gap aside)."""
        with self._lock:
            return [i for i in range(len(self._redis)) if i not in self._down]

    def stop_redis(self, node: int = 0) -> None:
        """Kill a Redis (no persistence: every key is lost); :meth:`start_redis` brings it
        back on the same port."""
        with self._lock:
            self._kill_redis(node)

    def start_redis(self, node: int = 0) -> None:
        with self._lock:
            self._redis[node] = self._start_redis(node)

    def restart_redis(self, node: int = 0) -> None:
        """:meth:`stop_redis` then :meth:`start_redis` (not for a node that is down a while:
        its own restart is under way)."""
        with self._lock:
            if node in self._down:
                return
            self._kill_redis(node)
            self._redis[node] = self._start_redis(node)

    def take_down(self, node: int, seconds: float) -> None:
        """Kill a Redis and start it again, empty, ``seconds`` later; one node at a time (the
        others stay up, for the faults on their keys)."""

        def back() -> None:
            with self._lock:
                try:
                    self._redis[node] = self._start_redis(node)
                finally:
                    del self._down[node]

        with self._lock:
            if self._down:
                return
            self._kill_redis(node)
            self._down[node] = threading.Timer(seconds, back)
            self._down[node].start()

    def wait_back(self) -> None:
        """Until every node taken down is up again."""
        with self._lock:
            restarts = list(self._down.values())
        for restart in restarts:
            restart.join()

    def _kill_redis(self, node: int) -> None:
        self._redis[node].kill()
        self._redis[node].wait(15)

    def _start_postgres(self) -> tuple[subprocess.Popen[str], str]:
        """A process holding the embedded server's lease; the server stops with it."""
        holder = subprocess.Popen(
            [sys.executable, "-c", _HOLDER, str(self._postgres_dir)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert holder.stdout is not None
        return holder, holder.stdout.readline().strip()

    def _stop_postgres(self) -> None:
        assert self._holder is not None and self._holder.stdin is not None
        self._holder.stdin.close()  # the only lease holder leaves: a fast shutdown
        self._holder.wait(60)

    def restart_postgres(self) -> None:
        self._stop_postgres()
        self._holder, url = self._start_postgres()
        assert url == self.database_url, (url, self.database_url)

    def crash_postgres(self) -> None:
        """An immediate shutdown (SIGQUIT to the postmaster): no checkpoint, shared memory
        and its WAL buffers gone, recovery at the next start replays only what reached the
        disk — so commits made with ``synchronous_commit = off`` may be lost."""
        with psycopg.connect(self.database_url, autocommit=True) as conn:
            row = conn.execute("SHOW data_directory").fetchone()
        assert row is not None
        pid = int((Path(row[0]) / "postmaster.pid").read_text().split()[0])
        os.kill(pid, signal.SIGQUIT)
        if not _wait(lambda: not _alive(pid), 30):
            raise RuntimeError(f"PostgreSQL (pid {pid}) still running 30 s after SIGQUIT")
        self.restart_postgres()

    def stop(self) -> None:
        self.wait_back()
        for node in range(len(self._redis)):
            self._kill_redis(node)
        if self._holder is not None:
            self._stop_postgres()


_HOLDER = """
import sys
from pathlib import Path
from duejobs.dev.embedded import EmbeddedPostgres
url, _ = EmbeddedPostgres(Path(sys.argv[1])).start()
print(url, flush=True)
sys.stdin.readline()
"""


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def _answers(client: redis.Redis) -> bool:
    try:
        return bool(client.ping())
    except redis.RedisError:
        return False


FAULT_KINDS = (
    "delete-job-hashes",
    "delete-queue-entries",
    "delete-registry-members",
    "forget-queue-list",
    "kill-reconciler",
    "kill-scheduler",
    "kill-worker",
    "pause-scheduler",
    "pg-terminate-all",
    "pg-terminate-one",
    "popped-and-lost",
    "postgres-crash",
    "postgres-restart",
    "redis-flushall",
    "redis-restart",
)
# In partitioned mode, besides.
PARTITION_FAULTS = ("drop-coming-partitions",)
# With several Redis nodes, besides.
NODE_FAULTS = ("node-down",)
DAILY = Partitioning(timedelta(days=1), 2)


class _Faults:
    """Each fault kind, one method; ``inject`` runs them in a seeded shuffled cycle so that
    even a short run meets every kind."""

    def __init__(
        self,
        cluster: _Cluster,
        servers: Servers,
        rng: random.Random,
        config: ChaosConfig,
    ) -> None:
        self.cluster, self.servers, self.rng = cluster, servers, rng
        self.clients = [redis.Redis.from_url(url) for url in servers.redis_urls]
        self.queues = config.queues
        self.kinds: dict[str, Callable[[], None]] = {
            "kill-worker": lambda: cluster.kill("worker", rng),
            "kill-scheduler": lambda: cluster.kill("scheduler", rng),
            "kill-reconciler": lambda: cluster.kill("reconciler", rng),
            "pause-scheduler": lambda: cluster.pause("scheduler", rng, rng.uniform(1, 5)),
            "popped-and-lost": self._popped_and_lost,
            "redis-flushall": self._flushall,
            "redis-restart": lambda: servers.restart_redis(self._node()),
            "postgres-restart": servers.restart_postgres,
            "postgres-crash": servers.crash_postgres,
            "delete-job-hashes": self._delete_hashes,
            "delete-queue-entries": self._delete_entries,
            "delete-registry-members": self._delete_members,
            "forget-queue-list": self._forget_queues,
            "pg-terminate-one": lambda: self._terminate(everyone=False),
            "pg-terminate-all": lambda: self._terminate(everyone=True),
        }
        assert tuple(sorted(self.kinds)) == FAULT_KINDS
        if config.partitioned:
            self.kinds["drop-coming-partitions"] = self._drop_coming
        if config.nodes > 1:
            self.kinds["node-down"] = self._node_down
        self._cycle: list[str] = []
        self.injected: set[str] = set()

    def inject(self) -> str:
        if not self._cycle:
            self._cycle = sorted(self.kinds)
            self.rng.shuffle(self._cycle)
        kind = self._cycle.pop()
        self.kinds[kind]()
        self.injected.add(kind)
        return kind

    def _drop_coming(self) -> None:
        """The partitions made ahead dropped (an operator's mistake, a restore without them):
        new schedules meanwhile land in the default partition, and the reconciler must make
        them again. Only empty ones: a coming range that holds a schedule is left alone."""
        engine = make_engine(sqlalchemy_url(self.servers.database_url))
        try:
            with engine.connect() as conn:
                now = store.database_now(conn)
                coming = [p.start for p in store.partitions(conn) if p.start and p.start > now]
        finally:
            engine.dispose()
        with psycopg.connect(libpq_url(self.servers.database_url)) as conn:
            conn.execute("SET lock_timeout = '2s'")
            for start in coming:
                names = [partition_name(t, start) for t in PARTITIONED]
                for name in names:
                    conn.execute(f"LOCK TABLE {name} IN ACCESS EXCLUSIVE MODE")
                if any(
                    conn.execute(f"SELECT EXISTS (SELECT 1 FROM {n})").fetchone()[0]  # type: ignore[index]
                    for n in names
                ):
                    conn.rollback()
                    continue
                for name in reversed(names):
                    conn.execute(f"DROP TABLE {name}")
                conn.commit()

    def _node(self) -> int:
        """A node a Redis fault lands on: one that is up (one node at most is down)."""
        up = self.servers.up()
        return up[0] if len(up) == 1 else self.rng.choice(up)

    def _on_node(self) -> tuple[redis.Redis, str]:
        """A node's client and one of its queue's RQ queues (a band: see
        :mod:`duejobs.rq_wire.bands`), for a fault on its keys."""
        node = self._node()
        return self.clients[node], band_queue(self.queues[node], self.rng.choice(PRIORITIES))

    def _node_down(self) -> None:
        """A node killed and started again, empty, a few seconds later: meanwhile its
        queue's jobs cannot be pushed or taken; the others' go on."""
        self.servers.take_down(self._node(), self.rng.uniform(2, 6))

    def _popped_and_lost(self) -> None:
        """What a worker killed between taking a job from Redis and claiming its row leaves:
        the id gone from the queue, its hash ``queued`` — or ``started`` by a dead worker."""
        client, queue = self._on_node()
        job = client.lpop("rq:queue:" + queue)
        if isinstance(job, bytes) and self.rng.random() < 0.5:
            client.hset(
                "rq:job:" + job.decode(),
                mapping={"status": "started", "worker_name": "chaos-ghost"},
            )

    def _flushall(self) -> None:
        self._on_node()[0].flushall()

    def _sample(self, ids: list[Any], most: int = 5) -> list[Any]:
        return self.rng.sample(ids, min(most, len(ids)))

    def _delete_hashes(self) -> None:
        client = self._on_node()[0]
        keys = list(itertools.islice(client.scan_iter("rq:job:dj-*", count=500), 500))
        for key in self._sample(keys):
            client.delete(key)

    def _delete_entries(self) -> None:
        client, queue = self._on_node()
        key = "rq:queue:" + queue
        for job in self._sample(client.lrange(key, 0, 500)):
            client.lrem(key, 0, job)

    def _delete_members(self) -> None:
        client, queue = self._on_node()
        key = "rq:scheduled:" + queue
        for job in self._sample(client.zrange(key, 0, 500)):
            client.zrem(key, job)

    def _forget_queues(self) -> None:
        """The set of every queue duejobs pushed to, deleted (an operator's cleanup): the
        jobs waiting in a band's scheduled registry must still be promoted."""
        self._on_node()[0].delete(QUEUES_KEY)

    def _terminate(self, everyone: bool) -> None:
        with psycopg.connect(self.servers.database_url, autocommit=True) as admin:
            pids = [
                row[0]
                for row in admin.execute(
                    "SELECT pid FROM pg_stat_activity "
                    "WHERE datname = current_database() AND pid <> pg_backend_pid()"
                )
            ]
            for pid in pids if everyone else self._sample(pids, 1):
                admin.execute("SELECT pg_terminate_backend(%s)", (pid,))


# The priorities schedules are given: one of each band, the default band the most.
PRIORITIES = (-50, 0, 0, 50)


def _plan(app: duejobs.App, rng: random.Random, config: ChaosConfig) -> list[object]:
    """The seeded schedules: due over the fault phase, some retried, some slow."""
    tenants = ["acme", "globex", "initech"]
    requests = []
    for _ in range(config.schedules):
        roll = rng.random()
        delay = rng.uniform(0, config.fault_seconds)
        payload: dict[str, float] = {}
        if roll < 0.15:
            job_type, payload = "chaos-flaky", {"fail_times": rng.randint(1, 2)}
        elif roll < 0.20:
            job_type, payload = "chaos-slow", {"seconds": round(rng.uniform(0.2, 1.0), 2)}
        else:
            job_type = "chaos"
        tenant = rng.choice(tenants)
        queue = rng.choice(config.queues) if config.nodes > 1 else None
        requests.append(
            duejobs.ScheduleRequest(
                job_type,
                payload,
                delay=timedelta(seconds=delay),
                tenant=tenant,
                queue=queue,
                priority=rng.choice(PRIORITIES),  # every band of the queue in use
            )
        )
    ids: list[object] = list(app.schedule_many(requests))
    queues = config.queues
    for i in range(config.recurring):
        app.recurring(
            f"chaos-{i}",
            cron="* * * * *",
            type="chaos",
            tenant=tenants[i % 3],
            queue=queues[i % len(queues)],
        )
    return ids


def _change(app: duejobs.App, ids: list[object], rng: random.Random, report: ChaosReport) -> None:
    """A reschedule or a cancel made while the faults go on, as an application would."""
    target = rng.choice(ids)
    try:
        if rng.random() < 0.5:
            delay = timedelta(seconds=rng.uniform(0, 8))
            app.reschedule(target, delay=delay, priority=rng.choice(PRIORITIES))  # type: ignore[arg-type]
            report.actions["rescheduled"] += 1
        else:
            app.cancel(target)  # type: ignore[arg-type]
            report.actions["cancelled"] += 1
    except DuejobsError:
        report.actions["refused (finished, or the database was cut)"] += 1


# Live rows due by a time: by their due time, or, for a row a rate limit turned back (due
# again at its slot), by the due time it had before (its put-back's ``moved_from``).
_LIVE_DUE = (
    "SELECT count(*) FROM scheduled_jobs s WHERE s.status IN ('scheduled', 'running') "
    "AND (s.due_at <= %(at)s OR EXISTS (SELECT 1 FROM scheduled_job_events e "
    "WHERE e.schedule_id = s.id AND e.version = s.version AND e.kind = 'requeued' "
    "AND e.detail->>'reason' = 'rate_limited' "
    "AND CAST(e.detail->>'moved_from' AS timestamptz) <= %(at)s))"
)


# Rate limits in force through the run: the plan's tenant "initech" and the default queue.
# Each is held to its promise below: at most N + 1 starts in any window of one period.
TENANT_LIMIT, QUEUE_LIMIT = ("initech", "5/s"), (DEFAULT_QUEUE, "30/s")
# The most starts of one limit's in any window of its period (one opens at each start).
_OVER_A_LIMIT = (
    "SELECT COALESCE(max(n), 0) FROM (SELECT (SELECT count(*) FROM scheduled_job_attempts b "
    "JOIN scheduled_jobs t ON t.id = b.schedule_id WHERE {key} = %s "
    "AND b.started_at >= a.started_at AND b.started_at < a.started_at + interval '1 second') "
    "AS n FROM scheduled_job_attempts a JOIN scheduled_jobs s ON s.id = a.schedule_id "
    "WHERE {outer} = %s) AS windows"
)
_LIMITED = {
    "starts over the tenant's rate limit": (
        _OVER_A_LIMIT.format(key="t.tenant", outer="s.tenant"),
        TENANT_LIMIT,
    ),
    "starts over the queue's rate limit": (
        _OVER_A_LIMIT.format(key="t.queue", outer="s.queue"),
        QUEUE_LIMIT,
    ),
}
_VIOLATIONS = {
    "due but not terminal": _LIVE_DUE,
    "effect applied twice": (
        "SELECT count(*) FROM (SELECT effect_key FROM chaos_effects "
        "GROUP BY effect_key HAVING count(*) > 1) AS twice"
    ),
    "effect before its due time": "SELECT count(*) FROM chaos_effects WHERE applied_at < due_at",
    "started before its due time": (
        "SELECT count(*) FROM scheduled_job_events "
        "WHERE kind = 'started' AND CAST(detail->>'lag_ms' AS double precision) < 0"
    ),
    "cancelled or superseded version ran": (
        "SELECT count(*) FROM chaos_effects e JOIN scheduled_jobs s ON s.id = e.schedule_id "
        "WHERE s.status <> 'succeeded' OR s.version <> e.version"
    ),
    "succeeded without its effect": (
        "SELECT count(*) FROM scheduled_jobs s WHERE s.status = 'succeeded' AND NOT EXISTS "
        "(SELECT 1 FROM chaos_effects e WHERE e.schedule_id = s.id AND e.version = s.version)"
    ),
}


def run_chaos(config: ChaosConfig, folder: Path | None = None) -> ChaosReport:
    """One seeded run on servers of its own under ``folder``; see the module docstring."""
    folder = folder or Path(tempfile.mkdtemp(prefix=f"duejobs-chaos-{config.seed}-"))
    if config.workers < config.nodes:
        raise ValueError(
            f"{config.nodes} nodes need at least as many workers, not {config.workers}"
        )
    servers = Servers(folder / "servers", partitioned=config.partitioned, nodes=config.nodes)
    try:
        return _run(config, servers, folder)
    finally:
        servers.stop()


def _run(config: ChaosConfig, servers: Servers, logs: Path) -> ChaosReport:
    pg, redis_url = libpq_url(servers.database_url), servers.redis_url
    rng = random.Random(config.seed)
    report = ChaosReport(config.seed)
    with psycopg.connect(pg, autocommit=True) as admin:
        admin.execute(EFFECTS)
    homes = dict(zip(config.queues[1:], servers.redis_urls[1:], strict=True))
    app = duejobs.App(database_url=servers.database_url, redis_url=redis_url, redis_nodes=homes)
    env = {
        **os.environ,
        "DUEJOBS_DATABASE_URL": servers.database_url,
        "DUEJOBS_REDIS_URL": redis_url,
        "DUEJOBS_REDIS_NODES": ",".join(f"{q}={url}" for q, url in homes.items()),
        "PYTHONPATH": str(ROOT),
    }
    app.set_quota(TENANT_LIMIT[0], max_rate=TENANT_LIMIT[1])
    app.set_rate_limit(*QUEUE_LIMIT)
    ids = _plan(app, rng, config)
    report.schedules = len(ids)
    cluster = _Cluster(env, logs, config)
    try:
        faults = _Faults(cluster, servers, rng, config)
        until = time.monotonic() + config.fault_seconds
        # For the run's time, and at least until every kind was injected once.
        while time.monotonic() < until or len(faults.injected) < len(faults.kinds):
            try:
                report.faults[faults.inject()] += 1
            except (redis.RedisError, psycopg.Error) as exc:  # the fault hit the injector
                report.faults[f"injector retried ({type(exc).__name__})"] += 1
            for _ in range(3):
                _change(app, ids, rng, report)
            time.sleep(rng.uniform(*config.fault_gap))
            for kind in cluster.revive():
                report.exits[kind] += 1
        servers.wait_back()  # a node taken down is back before the recovery is timed
        last_fault = _db_now(pg)
        report.recovery_seconds = _settle(pg, last_fault, config, report, cluster)
        # Rows rescheduled during the faults may be due a little after the last one.
        cutoff = last_fault + timedelta(seconds=10)
        _wait(lambda: _count(pg, _LIVE_DUE, {"at": cutoff}) == 0, config.settle_timeout)
        if config.partitioned and not _wait(lambda: _coming_ready(app), config.settle_timeout):
            report.violations["coming partitions not made again"] = 1
    finally:
        cluster.stop()
        app.close()
    with psycopg.connect(pg, autocommit=True) as conn:
        for name, sql in _VIOLATIONS.items():
            args = {"at": cutoff} if "%(at)s" in sql else {}
            report.violations[name] = int(conn.execute(sql, args).fetchone()[0])  # type: ignore[index]
        for name, (sql, (key, rate)) in _LIMITED.items():
            most = int(conn.execute(sql, (key, key)).fetchone()[0])  # type: ignore[index]
            report.violations[name] = max(0, most - (parse_rate(rate).count + 1))
        lag = conn.execute(
            "SELECT max(CAST(detail->>'lag_ms' AS double precision)) "
            "FROM scheduled_job_events WHERE kind = 'started'"
        ).fetchone()
        report.worst_start_lag = float((lag and lag[0]) or 0) / 1000
        report.states = {
            status: int(n)
            for status, n in conn.execute(
                "SELECT status, count(*) FROM scheduled_jobs GROUP BY status"
            )
        }
    if report.recovery_seconds is None or report.recovery_seconds > config.recovery_bound:
        report.violations["recovery past its bound"] = 1
    return report


def _coming_ready(app: duejobs.App) -> bool:
    """Whether the partitions of today and the two days after exist again."""
    with app.engine.connect() as conn:
        now = store.database_now(conn)
        ends = [p.end for p in store.partitions(conn, details=False) if p.end]
    return bool(ends) and max(ends) > now + 2 * DAILY.period


def _db_now(url: str) -> datetime:
    with psycopg.connect(url) as conn:
        return conn.execute("SELECT now()").fetchone()[0]  # type: ignore[index,no-any-return]


def _count(url: str, sql: str, params: tuple[object, ...] | dict[str, object] = ()) -> int:
    try:
        with psycopg.connect(url) as conn:
            return int(conn.execute(sql, params).fetchone()[0])  # type: ignore[index]
    except psycopg.Error:
        return -1


def _wait(done: Callable[[], bool], timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while not done():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.25)
    return True


_SLOW = """
SELECT s.status, s.queue_job_id, s.attempts, round(extract(epoch FROM now() - s.due_at)),
       s.lease_expires_at > now(),
       (SELECT kind || ' ' || detail::text FROM scheduled_job_events e
        WHERE e.schedule_id = s.id ORDER BY e.at DESC LIMIT 1)
FROM scheduled_jobs s
WHERE s.status IN ('scheduled', 'running') AND s.due_at <= %s
ORDER BY s.due_at LIMIT 10
"""


def _settle(
    url: str, last_fault: datetime, config: ChaosConfig, report: ChaosReport, cluster: _Cluster
) -> float | None:
    """Seconds from the last fault until nothing due by then was left live (None: never,
    within ``settle_timeout``); what was still live 15 s in goes into the report. A process
    that exits meanwhile is started again, as its supervisor would."""

    def settled() -> bool:
        for kind in cluster.revive():
            report.exits[kind] += 1
        return _count(url, _LIVE_DUE, {"at": last_fault}) == 0

    started = time.monotonic()
    if _wait(settled, 15):
        return time.monotonic() - started
    with contextlib.suppress(psycopg.Error), psycopg.connect(url) as conn:
        report.slow = [" | ".join(map(str, row)) for row in conn.execute(_SLOW, (last_fault,))]
    if _wait(settled, config.settle_timeout - 15):
        return time.monotonic() - started
    return None


def main(seeds: list[str]) -> int:
    schedules = int(os.environ.get("CHAOS_SCHEDULES", str(ChaosConfig.schedules)))
    seconds = float(os.environ.get("CHAOS_SECONDS", "60"))
    nodes = int(os.environ.get("CHAOS_NODES", "1"))
    reports = []
    chosen = [int(s) for s in seeds] or [1, 2, 3]
    for seed in chosen:
        config = ChaosConfig(
            seed=seed,
            schedules=schedules,
            fault_seconds=seconds,
            nodes=nodes,
            workers=max(ChaosConfig.workers, nodes),
        )
        report = run_chaos(config)
        print("\n".join(report.lines()), flush=True)
        reports.append(report)
    worst = max((r.recovery_seconds or float("inf")) for r in reports)
    bad = sum(not r.ok for r in reports)
    print(
        f"\n{len(reports)} seeds, {sum(sum(r.faults.values()) for r in reports)} faults, "
        f"{sum(sum(r.violations.values()) for r in reports)} violations, "
        f"worst recovery {worst:.1f} s (bound {ChaosConfig().recovery_bound:.0f} s)"
    )
    # The worker's own promises through a seeded plan, at every setting (slots, processes).
    from bench import worker_model

    model_failed = worker_model.main([str(seed) for seed in chosen])
    outage_missed = False
    if nodes > 1:  # what one node down costs the queues on the others, as a figure
        from bench import node_outage

        with tempfile.TemporaryDirectory(prefix="duejobs-outage-db-") as folder:
            servers = Servers(Path(folder))  # a PostgreSQL of its own, as the seeds had
            try:
                for figure in node_outage.run(servers.database_url):
                    print(figure.line(), flush=True)
                    outage_missed |= not figure.ok
            finally:
                servers.stop()
    return 1 if bad or model_failed or outage_missed else 0
