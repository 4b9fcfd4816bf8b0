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
from typing import Any

from duejobs.delivery.deliverer import Deliverer
from duejobs.delivery.nodes import Node
from duejobs.rq_wire.keys import JOB_PREFIX, WORKER_PREFIX, WORKERS_KEY, queue_keys, stamp

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
        keys = [WORKERS_KEY]
        for name in queues:
            queue = queue_keys(name)
            keys += [queue.finished, queue.failed, queue.started, queue.workers]
        args: list[Any] = [JOB_PREFIX, WORKER_PREFIX, deliverer.result_ttl, most, now]
        done = Cleaned()
        for _ in range(MAX_CALLS):
            expired, abandoned, dead, more = (int(n) for n in node.clean(keys=keys, args=args))
            done = Cleaned(
                done.expired + expired, done.abandoned + abandoned, done.dead_workers + dead
            )
            if not more:
                break
        return done

    done = deliverer.on_each_node(clean_on)
    return Cleaned(*(sum(getattr(c, f.name) for c in done) for f in fields(Cleaned)))


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
        with node.redis.pipeline(transaction=False) as pipe:
            pipe.info("memory")
            pipe.dbsize()
            for _, key, size in kinds:
                getattr(pipe, size)(key)
                pipe.memory_usage(key, samples=5)
            memory, keys, *counted = pipe.execute()
        summed: dict[str, Structure] = {}
        for (kind, _, _), entries, used in zip(kinds, counted[0::2], counted[1::2], strict=True):
            was = summed.get(kind, Structure())
            summed[kind] = Structure(was.entries + int(entries), was.bytes + int(used or 0))
        return RedisFigures(int(memory["used_memory"]), int(keys), summed)

    total: dict[str, Structure] = {kind: Structure() for kind in ("workers", *STRUCTURES)}
    memory = keys = 0
    for figures in deliverer.on_each_node(count_on):
        memory, keys = memory + figures.used_memory, keys + figures.keys
        for kind, one in figures.structures.items():
            was = total[kind]
            total[kind] = Structure(was.entries + one.entries, was.bytes + one.bytes)
    return RedisFigures(memory, keys, total)
