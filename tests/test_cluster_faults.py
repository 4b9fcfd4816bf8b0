"""duejobs on a Redis Cluster through its faults: the scheduler, an 8-slot worker and the
reconciler as processes over six queues on a cluster of three masters and three replicas
started by the test, and mid-run a busy queue's master SIGKILLed (its replica promoted by
the cluster), or its replica promoted by hand and then flushed (one that lagged far behind),
or its slot migrated to another master with ``redis-cli --cluster reshard`` (skipped, saying
so, without it), or every server killed and started again empty, or the cluster away when
the services start. Counts lost schedules, handlers run twice, early starts and services that
exited, and prints the time from the fault to the first job finished after it.

Each takes 10-20 s: a few seconds of schedules, the fault, and the recovery waited for
(make test-long). Seen failing before the cluster's URL was known ("not a Redis URL"), and
with the worker's blocking take naming every queue's lists in one command (the worker
exited on the cluster's refusal, its jobs lost with it); the whole cluster restarted and the
cluster away at the start, with redis-py's cluster errors (``RedisClusterUnreachableError``,
not a ``RedisError``) left out of the outages waited out (the worker exited)."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

from duejobs import App
from tests.support.cluster import QUEUES, cluster
from tests.support.processes import Proc
from tests.support.topology import report, run_workload
from tests.support.valkey import server_binary

pytestmark = [pytest.mark.long, pytest.mark.slow]


@pytest.mark.parametrize(
    "fault",
    [
        "master-killed",
        "replica-promoted-flushed",
        "slots-resharded",
        "whole-cluster-restarted",
        "away-at-start",
    ],
    ids=str,
)
def test_a_cluster_master_lost_mid_run_loses_nothing_runs_nothing_twice_or_early(
    fault: str,
    tmp_path: Path,
    database_url: str,
    app: App,
    spawn: Callable[..., Proc],
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A cluster of the test's own (the fault leaves it without a replica for that shard)."""
    busy = QUEUES[4]  # its slot comes early in its master's range: a short reshard
    cli = shutil.which("redis-cli") or shutil.which("valkey-cli")
    if fault == "slots-resharded" and cli is None:
        pytest.skip("no redis-cli here to reshard with (Debian's redis-tools)")
    with cluster(server_binary(), tmp_path) as made:

        def strike() -> float:
            if fault == "master-killed":
                return made.kill_master_of(busy)
            if fault == "slots-resharded":
                assert cli is not None
                return made.reshard_away(busy, cli)
            if fault == "whole-cluster-restarted":
                return made.restart_all(away=2.0)
            if fault == "away-at-start":  # the services have met only a cluster away
                return made.start_again()
            return made.promote_replica_of(busy, flush=True)

        if fault == "away-at-start":
            made.kill_all()

        counts = run_workload(
            spawn, database_url, database_url, strike, seed=61, redis_url=made.url, queues=QUEUES
        )
    report(capsys, f"Redis Cluster, {fault}", counts)
    assert (counts.lost, counts.twice, counts.rescued, counts.early) == (0, 0, 0, 0), (
        counts.evidence
    )
    assert counts.exited == [], counts.evidence
