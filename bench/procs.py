"""Worker processes for the benchmarks: `python -m bench.procs KIND QUEUE`.

Prints one JSON line with the wall-clock span of its burst (time.time(), comparable across
processes on one machine). KIND is `bare` (an RQ SimpleWorker on a queue of bare jobs) or
`duejobs` (a duejobs worker with the bench App)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from redis import Redis
from rq import SimpleWorker
from rq.serializers import JSONSerializer

ROOT = Path(__file__).resolve().parent.parent


def spawn_workers(kind: str, queue: str, count: int, env: dict[str, str]) -> list[dict[str, float]]:
    """Start ``count`` burst workers at once and return each one's span."""
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "bench.procs", kind, queue],
            env={**os.environ, **env, "PYTHONPATH": str(ROOT)},
            cwd=ROOT,
            stdout=subprocess.PIPE,
            text=True,
        )
        for _ in range(count)
    ]
    spans = []
    for proc in procs:
        out, _ = proc.communicate(timeout=1800)
        assert proc.returncode == 0, out
        spans.append(json.loads(out.strip().splitlines()[-1]))
    return spans


def serve_workers(
    kind: str, queue: str, count: int, env: dict[str, str]
) -> list[subprocess.Popen[bytes]]:
    """``count`` workers that keep listening on ``queue`` until :func:`stop_all`."""
    return [
        subprocess.Popen(
            [sys.executable, "-m", "bench.procs", kind, queue, "serve"],
            env={**os.environ, **env, "PYTHONPATH": str(ROOT)},
            cwd=ROOT,
            stdout=subprocess.DEVNULL,
        )
        for _ in range(count)
    ]


def stop_all(procs: list[subprocess.Popen[bytes]]) -> None:
    """SIGTERM every process (warm shutdown), then wait for each."""
    for proc in procs:
        proc.send_signal(signal.SIGTERM)
    for proc in procs:
        proc.wait(60)


def main() -> None:
    kind, queue = sys.argv[1], sys.argv[2]
    pinned = os.environ.get("BENCH_PIN_CPU")
    if pinned:  # as the duejobs worker beside it is pinned (bench/concurrency.py)
        os.sched_setaffinity(0, {int(pinned)})
    redis = Redis.from_url(os.environ["DUEJOBS_REDIS_URL"])
    serve = sys.argv[3:4] == ["serve"]  # keep listening until SIGTERM, as in production
    if kind == "bare":
        bare = SimpleWorker([queue], connection=redis, serializer=JSONSerializer)
        work = lambda: bare.work(burst=not serve, logging_level="WARNING", with_scheduler=False)  # noqa: E731
    else:
        from bench.jobs import app
        from duejobs.worker import Runtime, Worker

        assert app is not None
        ours = Worker(Runtime(app))
        work = lambda: ours.work(burst=not serve)  # noqa: E731
    import bench.jobs  # noqa: F401  (loaded before timing, as a real worker would be)

    start = time.time()
    work()
    print(json.dumps({"start": start, "end": time.time()}))


if __name__ == "__main__":
    main()
