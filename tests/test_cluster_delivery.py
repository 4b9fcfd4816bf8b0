"""The push side on a Redis Cluster of three masters and three replicas, started by the test
(:mod:`tests.support.cluster`): each queue's keys and jobs in its hash slot, queues spread
over the shards, and the deliverer's every call — push, promotion, the presence check,
removal, counts — made there as on one node.

Seen failing against the deliverer before it knew a cluster (its RQ names untagged, the sets
of every queue named beside a queue's keys): every call refused with "all keys must map to
the same key slot", and a node mapping beside a cluster taken without a word."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest
from redis import Redis
from redis.cluster import RedisCluster

from duejobs.delivery import Deliverer
from duejobs.rq_wire.bands import band_queue
from duejobs.rq_wire.keys import QUEUES_KEY, queue_keys, rq_name
from tests.support.cluster import QUEUES, push_due


@pytest.fixture
def deliverer(cluster_client: RedisCluster) -> Iterator[Deliverer]:
    made = Deliverer(cluster_client, "mail")
    yield made
    made.close()


def _slots(cluster_client: RedisCluster, keys: list[str]) -> set[int]:
    return {int(cluster_client.keyslot(key)) for key in keys}


def test_each_queues_keys_and_jobs_sit_in_its_hash_slot_and_queues_spread_over_the_shards(
    deliverer: Deliverer, cluster_client: RedisCluster
) -> None:
    pushes = [push_due(q, due, p) for q in QUEUES for due in (-1, 60) for p in (-5, 0, 5)]
    result = deliverer.push(pushes, datetime.now(UTC))
    assert (result.queued, result.deferred) == (len(QUEUES) * 3, len(QUEUES) * 3)
    owners = set()
    for queue in QUEUES:
        names = [band_queue(rq_name(queue, True), p) for p in (-5, 0, 5)]
        keys = [queue_keys(n).queue for n in names] + [queue_keys(n).scheduled for n in names]
        jobs = [p for p in pushes if p.delivery.queue == queue]
        hashes = [queue_keys(names[0]).job_prefix + p.delivery.job_id for p in jobs]
        assert all(cluster_client.exists(h) for h in hashes)
        assert len(_slots(cluster_client, keys + hashes)) == 1, queue
        owners.add(cluster_client.get_node_from_key(keys[0]).port)
    assert len(owners) == 3
    assert {m.decode() for m in cluster_client.smembers(QUEUES_KEY)} >= {
        rq_name(q, True) for q in QUEUES
    }


def test_a_job_pushed_again_on_a_cluster_is_found_there_and_not_made_twice(
    deliverer: Deliverer, cluster_client: RedisCluster
) -> None:
    pushes = [push_due(q, -1) for q in QUEUES]
    deliverer.push(pushes, datetime.now(UTC))
    again = deliverer.push(pushes, datetime.now(UTC))
    assert (again.present, again.created) == (len(QUEUES), frozenset())
    assert deliverer.depth() == (len(QUEUES), 0)


def test_jobs_due_later_are_promoted_on_every_shard_when_the_clock_reaches_them(
    deliverer: Deliverer,
) -> None:
    pushes = [push_due(q, 30) for q in QUEUES]
    deliverer.push(pushes, datetime.now(UTC))
    assert deliverer.depth() == (0, len(QUEUES))
    early = deliverer.promote(datetime.now(UTC))
    assert early.moved == 0 and early.next_due is not None
    late = deliverer.promote(datetime.now(UTC) + timedelta(seconds=31))
    assert (late.moved, late.next_due) == (len(QUEUES), None)
    assert deliverer.depth() == (len(QUEUES), 0)


def test_a_waiting_job_on_a_cluster_is_live_until_removed_with_or_without_its_queue(
    deliverer: Deliverer,
) -> None:
    pushes = [push_due(q, due) for q in QUEUES for due in (-1, 30)]
    deliverer.push(pushes, datetime.now(UTC))
    jobs = [(p.delivery.job_id, p.delivery.due_at, False, p.delivery.queue) for p in pushes]
    assert deliverer.live(jobs) == [True] * len(jobs)
    first, rest = pushes[:2], pushes[2:]
    removed = deliverer.remove_many([(p.delivery.job_id, None) for p in first])
    removed += deliverer.remove_many([(p.delivery.job_id, p.delivery.queue) for p in rest])
    assert removed == [True] * len(pushes)
    assert deliverer.live(jobs) == [False] * len(jobs)
    assert deliverer.depth() == (0, 0)


def test_a_jobs_state_on_a_cluster_is_read_from_its_queues_slot(deliverer: Deliverer) -> None:
    push = push_due("billing", -1, priority=5)
    deliverer.push([push], datetime.now(UTC))
    d = push.delivery
    state = deliverer.job_state(d.job_id, d.due_at or datetime.now(UTC), False, d.queue)
    assert (state.status, state.origin, state.live) == ("queued", "{billing}+high", True)


def test_a_cluster_with_a_node_mapping_is_refused(cluster_client: RedisCluster) -> None:
    with pytest.raises(ValueError, match="places the queues itself"):
        Deliverer(cluster_client, "mail", nodes={"sms": Redis()})
