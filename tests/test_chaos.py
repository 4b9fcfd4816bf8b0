"""A short fault-injection run (the full one is `python -m bench chaos`): every fault kind at
least once — real restarts of a PostgreSQL and a Redis of the run's own among them — while
real schedulers, workers and a reconciler run, then every guarantee checked by the database.
With DUEJOBS_TEST_PARTITIONED=1, on partitioned mode, the coming partitions dropped among the
faults.

Seen failing against a build whose push trusted a job hash's status (a job popped and lost
left its schedule stuck: "due but not terminal"); the three-node run, against a deliverer
that put every queue on the first node (186 schedules "due but not terminal": their workers
listen on their own nodes).
"""

from __future__ import annotations

from pathlib import Path

from bench.chaos import FAULT_KINDS, NODE_FAULTS, PARTITION_FAULTS, ChaosConfig, run_chaos
from tests.conftest import PARTITIONED


def test_a_short_fault_injection_run_across_three_redis_nodes_keeps_every_guarantee(
    tmp_path: Path,
) -> None:
    """Three Redis nodes, a queue on each and a worker per queue (one more on the first):
    every Redis fault lands on one node, and a node is killed and comes back empty a few
    seconds later; nothing is lost, nothing runs twice, the recovery stays in its bound."""
    config = ChaosConfig(
        seed=12,
        schedules=300,
        fault_seconds=14,
        fault_gap=(0.2, 0.5),
        recurring=3,
        recovery_bound=60,
        settle_timeout=90,
        nodes=3,
    )
    report = run_chaos(config, tmp_path)
    summary = "\n".join(report.lines())
    assert report.ok, summary
    assert {*FAULT_KINDS, *NODE_FAULTS} <= set(report.faults), summary
    assert report.states.get("succeeded", 0) >= 250, summary


def test_a_short_fault_injection_run_keeps_every_guarantee(tmp_path: Path) -> None:
    config = ChaosConfig(
        seed=11,
        schedules=300,
        fault_seconds=14,
        fault_gap=(0.2, 0.5),
        recurring=2,
        recovery_bound=60,
        settle_timeout=90,
        partitioned=PARTITIONED,
    )
    report = run_chaos(config, tmp_path)
    summary = "\n".join(report.lines())
    assert report.ok, summary
    kinds = {*FAULT_KINDS, *(PARTITION_FAULTS if PARTITIONED else ())}
    assert kinds <= set(report.faults), summary  # every kind met at least once
    assert report.states.get("succeeded", 0) >= 250, summary
