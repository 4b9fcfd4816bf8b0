"""Redis as teams run it highly available: a master, a replica and three Sentinels started
by the test, the master killed mid-run and the replica promoted, with the services as
processes following the master through the Sentinels' URL. Counts lost schedules, handlers
run twice, early starts and services that exited, and prints the time from the fault to the
first job finished after it (docs/deployment.md, docs/benchmarks.md).

Each takes 10-20 s: a few seconds of schedules, the fault, and the recovery waited for.
Seen failing against the build before: the Sentinel URL refused ("not a Redis URL").
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from duejobs import App
from tests.support.processes import Proc
from tests.support.sentinel import sentinels
from tests.support.topology import report, run_workload
from tests.support.valkey import server_binary


@pytest.mark.parametrize("flushed", [False, True], ids=["replica-in-step", "promoted-flushed"])
def test_a_redis_master_killed_and_its_replica_promoted_by_sentinel_lose_nothing(
    flushed: bool,
    tmp_path: Path,
    database_url: str,
    app: App,
    spawn: Callable[..., Proc],
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Redis behind three Sentinels: the master killed mid-run, the replica promoted, the old
    master back as its replica — and, the second time, the promoted replica flushed (one that
    lagged far behind). The services follow the master through the Sentinels' URL: none
    exits, no schedule is lost, run twice or early; what Redis lost is pushed again."""
    binary = server_binary()
    with sentinels(binary, tmp_path) as ha:

        def fault() -> float:
            promoted = ha.fail_over()
            if flushed:
                with ha.master().client() as client:
                    client.flushall()
            return promoted

        counts = run_workload(spawn, database_url, database_url, fault, seed=47, redis_url=ha.url)
    name = "promoted replica flushed" if flushed else "replica in step"
    report(capsys, f"Redis failover through Sentinel, {name}", counts)
    assert (counts.lost, counts.twice, counts.rescued, counts.early) == (0, 0, 0, 0), (
        counts.evidence
    )
    assert counts.exited == [], counts.evidence
