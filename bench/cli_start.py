"""How long the command line takes to answer ``--version`` and ``--help``, beside RQ's own
``rq --help`` measured in the same run, alternated (the machine is shared and noisy).

CLI_RUNS (15) runs of each. Target: each within 1.5x of ``rq --help`` (before the commands
were imported on first use: 1.8 s and 83 MiB for ``--version``, 4x ``rq --help``), and
``duejobs worker --help`` within 0.5 s.

    python -m bench.cli_start
"""

from __future__ import annotations

import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

RUNS = int(os.environ.get("CLI_RUNS", "15"))
TARGET = 1.5
WORKER_HELP = 0.5  # seconds
_BIN = Path(sys.executable).parent


def _time(argv: list[str]) -> float:
    started = time.perf_counter()
    subprocess.run(argv, check=True, capture_output=True)
    return time.perf_counter() - started


def main() -> int:
    commands = {
        "rq --help": [str(_BIN / "rq"), "--help"],
        "duejobs --version": [str(_BIN / "duejobs"), "--version"],
        "duejobs --help": [str(_BIN / "duejobs"), "--help"],
        "duejobs worker --help": [str(_BIN / "duejobs"), "worker", "--help"],
    }
    times: dict[str, list[float]] = {name: [] for name in commands}
    for _ in range(RUNS):
        for name, argv in commands.items():  # alternated: a noisy moment hits all alike
            times[name].append(_time(argv))
    peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    baseline = statistics.median(times["rq --help"])
    print(f"{RUNS} runs each, medians (largest child: {peak:.0f} MiB)")
    print(f"     {'rq --help':<20} {baseline * 1000:7.0f} ms  (baseline)")
    missed = 0
    for name in ("duejobs --version", "duejobs --help"):
        median = statistics.median(times[name])
        ratio = median / baseline
        ok = ratio <= TARGET
        missed += not ok
        print(
            f"{'ok  ' if ok else 'MISS'} {name:<20} {median * 1000:7.0f} ms  "
            f"{ratio:.2f}x rq --help (target <= {TARGET}x)"
        )
    worker = statistics.median(times["duejobs worker --help"])
    missed += worker > WORKER_HELP
    print(
        f"{'ok  ' if worker <= WORKER_HELP else 'MISS'} {'duejobs worker --help':<20} "
        f"{worker * 1000:7.0f} ms  {worker / baseline:.2f}x rq --help "
        f"(target <= {WORKER_HELP * 1000:.0f} ms)"
    )
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
