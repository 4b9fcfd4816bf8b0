"""RQ's registries and worker sets on every node: what the reconciler cleans of them, and what
the figures count of each structure duejobs writes to Redis.

What it promises:

* **Nothing stays past its expiry.** :func:`clean` is RQ's ``clean_registries``, which RQ's
  own worker runs every ten minutes in its loop and duejobs' worker, with a loop of its own,
  does not: finished and failed entries past their expiry leave their registries (a range by
  score, costing what expired, not what is there), a dead worker's started entries leave the
  started registries (their hashes failed, to expire in ``result_ttl``; an entry whose worker's
  key lives is left alone, whatever the clocks say), and dead workers leave ``rq:workers`` and
  the per-queue worker sets. One script per node; the reconciler runs it every pass.
* **Each structure counted.** :func:`structures` reads, per node, Redis' memory and key
  count, and each structure's entries and bytes (``MEMORY USAGE``, sampled), summed over the
  queues: what ``duejobs stats`` shows and the reconciler exports, so that a structure that
  grows is seen before Redis runs out of memory.

What it does not count: job hashes and results streams one by one (they expire on their own,
``result_ttl`` after their job finished); they are in the key count and Redis' memory.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from datetime import UTC, datetime
from typing import Any, cast

from redis.cluster import RedisCluster

from duejobs.delivery.deliverer import Deliverer
from duejobs.delivery.nodes import Node
from duejobs.rq_wire.bands import queue_of
from duejobs.rq_wire.keys import WORKERS_KEY, queue_keys, stamp

# The structures of one RQ queue that :func:`structures` counts, by kind.
STRUCTURES = ("queue", "scheduled", "started", "finished", "failed", "queue_workers")


@dataclass(frozen=True)
class Cleaned:
    """What one cleanup removed: finished and failed entries past their expiry, started
    entries a dead worker left, and dead workers' places in the worker sets."""

    expired: int = 0
    abandoned: int = 0
    dead_workers: int = 0


@dataclass(frozen=True)
class Structure:
    """One kind of structure summed over every queue and node: its entries and its bytes."""

    entries: int = 0
    bytes: int = 0


@dataclass(frozen=True)
class RedisFigures:
    """What Redis holds, summed over the nodes: its memory in use, its keys, and each
    structure duejobs writes (the kinds of :data:`STRUCTURES`, and ``workers``)."""

    used_memory: int = 0
    keys: int = 0
    structures: dict[str, Structure] = field(default_factory=dict)


# The most calls one cleanup makes per node while registries still hold expired entries.
MAX_CALLS = 100


def clean(deliverer: Deliverer, most: int = 1000) -> Cleaned:
    """RQ's registry cleanup on every node (see the module docstring and
    :data:`~duejobs.rq_wire.scripts.CLEAN_SCRIPT`): calls of at most ``most`` entries per
    registry, made again while a registry had more (up to :data:`MAX_CALLS` per node; the
    next cleanup goes on)."""
    now = stamp(datetime.now(UTC))

    def clean_on(node: Node, queues: list[str]) -> Cleaned:
        done = Cleaned()
        for keys, args in _clean_calls(deliverer, queues, most, now):
            for _ in range(MAX_CALLS):
                counts = (int(n) for n in node.clean(keys=keys, args=args))
                expired, abandoned, dead, more = counts
                done = Cleaned(
                    done.expired + expired, done.abandoned + abandoned, done.dead_workers + dead
                )
                if not more:
                    break
        if deliverer.cluster:
            sets = [WORKERS_KEY, *(queue_keys(name).workers for name in queues)]
            done = Cleaned(done.expired, done.abandoned, done.dead_workers + _bury(node, sets))
        return done

    done = deliverer.on_each_node(clean_on)
    return Cleaned(*(sum(getattr(c, f.name) for c in done) for f in fields(Cleaned)))


def _clean_calls(
    deliverer: Deliverer, queues: list[str], most: int, now: str
) -> list[tuple[list[str], list[Any]]]:
    """The cleanup's script calls: one over every queue on one node; on a cluster one per
    queue (its bands share its slot), its worker sets left to :func:`_bury`."""
    by_queue: dict[str, list[str]] = {}
    for name in queues:
        by_queue.setdefault(queue_of(name) if deliverer.cluster else "", []).append(name)
    calls = []
    for names in by_queue.values():
        first = queue_keys(names[0])
        keys = [first.finished if deliverer.cluster else WORKERS_KEY]
        for queue in map(queue_keys, names):
            keys += [queue.finished, queue.failed, queue.started, queue.workers]
        args: list[Any] = [first.job_prefix, first.worker_prefix, deliverer.result_ttl, most, now]
        calls.append((keys, [*args, "0" if deliverer.cluster else "1"]))
    return calls


def _bury(node: Node, sets: list[str]) -> int:
    """Dead workers out of ``sets`` (a cluster's, read apart: their members live in slots of
    their own); how many places were removed."""
    removed = 0
    for name in sets:
        members = list(node.redis.smembers(name))
        with node.redis.pipeline(transaction=False) as pipe:
            for member in members:
                pipe.exists(member)
            alive = pipe.execute()
        dead = [m for m, live in zip(members, alive, strict=True) if not live]
        if dead:
            removed += int(node.redis.srem(name, *dead))
    return removed


def _memory_and_keys(node: Node, cluster: bool) -> tuple[int, int]:
    """Redis' memory in use and its keys: the server's; a cluster's, summed over its masters."""
    if not cluster:
        with node.redis.pipeline(transaction=False) as pipe:
            pipe.info("memory")
            pipe.dbsize()
            memory, keys = pipe.execute()
        return int(memory["used_memory"]), int(keys)
    redis = cast(RedisCluster, node.redis)
    masters = redis.get_primaries()  # type: ignore[no-untyped-call]
    used = sum(int(redis.info("memory", target_nodes=m)["used_memory"]) for m in masters)
    return used, sum(int(redis.dbsize(target_nodes=m)) for m in masters)


def structures(deliverer: Deliverer) -> RedisFigures:
    """Each node's memory and keys, and every structure's entries and bytes (one pipeline
    per node; a node that does not answer counts for nothing)."""

    def count_on(node: Node, queues: list[str]) -> RedisFigures:
        kinds: list[tuple[str, str, str]] = [("workers", WORKERS_KEY, "scard")]
        for name in queues:
            queue = queue_keys(name)
            kinds += [
                ("queue", queue.queue, "llen"),
                ("scheduled", queue.scheduled, "zcard"),
                ("started", queue.started, "zcard"),
                ("finished", queue.finished, "zcard"),
                ("failed", queue.failed, "zcard"),
                ("queue_workers", queue.workers, "scard"),
            ]
        memory, keys = _memory_and_keys(node, deliverer.cluster)
        with node.redis.pipeline(transaction=False) as pipe:
            for _, key, size in kinds:
                getattr(pipe, size)(key)
                pipe.memory_usage(key, samples=5)
            counted = pipe.execute()
        summed: dict[str, Structure] = {}
        for (kind, _, _), entries, used in zip(kinds, counted[0::2], counted[1::2], strict=True):
            was = summed.get(kind, Structure())
            summed[kind] = Structure(was.entries + int(entries), was.bytes + int(used or 0))
        return RedisFigures(memory, keys, summed)

    total: dict[str, Structure] = {kind: Structure() for kind in ("workers", *STRUCTURES)}
    memory = keys = 0
    for figures in deliverer.on_each_node(count_on):
        memory, keys = memory + figures.used_memory, keys + figures.keys
        for kind, one in figures.structures.items():
            was = total[kind]
            total[kind] = Structure(was.entries + one.entries, was.bytes + one.bytes)
    return RedisFigures(memory, keys, total)
