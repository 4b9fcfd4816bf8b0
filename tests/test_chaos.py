"""A short fault-injection run (the full one is `python -m bench chaos`): every fault kind at
least once — real restarts of a PostgreSQL and a Redis of the run's own among them — while
real schedulers, workers and a reconciler run, then every guarantee checked by the database.
With DUEJOBS_TEST_PARTITIONED=1, on partitioned mode, the coming partitions dropped among the
faults.

Seen failing against a build whose push trusted a job hash's status (a job popped and lost
left its schedule stuck: "due but not terminal"); the three-node run, against a deliverer
that put every queue on the first node (186 schedules "due but not terminal": their workers
listen on their own nodes); with rate limits in force (a tenant's and the default queue's),
against a grant that let every start through (44 and 115 starts over the limits).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.chaos import FAULT_KINDS, NODE_FAULTS, PARTITION_FAULTS, ChaosConfig, run_chaos
from tests.support.servers import PARTITIONED

# Starts, pauses, kills or restarts servers of its own on free ports: run on its own
# (`pytest -m serial`), never beside another test process.
pytestmark = pytest.mark.serial


def _short_run(tmp_path: Path, kinds: set[str], **config: object) -> None:
    """A run of 300 schedules over 14 s of faults or more; every guarantee held, every kind
    of ``kinds`` met at least once, most schedules succeeded."""
    report = run_chaos(
        ChaosConfig(
            schedules=300,
            fault_seconds=14,
            fault_gap=(0.2, 0.5),
            recovery_bound=60,
            settle_timeout=90,
            **config,  # type: ignore[arg-type]
        ),
        tmp_path,
    )
    summary = "\n".join(report.lines())
    assert report.ok, summary
    assert kinds <= set(report.faults), summary
    assert report.states.get("succeeded", 0) >= 250, summary


@pytest.mark.long  # 25 s of faults on three Redis nodes: make test-long (test-all)
def test_a_short_fault_injection_run_across_three_redis_nodes_keeps_every_guarantee(
    tmp_path: Path,
) -> None:
    """Three Redis nodes, a queue on each and a worker per queue (one more on the first):
    every Redis fault lands on one node, and a node is killed and comes back empty a few
    seconds later; nothing is lost, nothing runs twice, the recovery stays in its bound."""
    _short_run(tmp_path, {*FAULT_KINDS, *NODE_FAULTS}, seed=12, recurring=3, nodes=3)


def test_a_short_fault_injection_run_keeps_every_guarantee(tmp_path: Path) -> None:
    kinds = {*FAULT_KINDS, *(PARTITION_FAULTS if PARTITIONED else ())}
    _short_run(tmp_path, kinds, seed=11, recurring=2, partitioned=PARTITIONED)
