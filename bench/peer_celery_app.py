"""The Celery app of ``bench.peer_celery``, on the Redis broker ``PEER_CELERY_BROKER`` names.

Its one task, ``noop(due)``, does nothing but keep its (due, start, end) in the worker's memory,
written to ``PEER_CELERY_SPANS`` (one file per worker process) when the worker shuts down, and
count itself in Redis (one ``INCR``: how the bench knows the work is done, since Celery holds
ETA tasks in memory, where no queue length shows them).
"""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path
from typing import Any

from celery import Celery
from celery.signals import worker_shutdown
from redis import Redis

BROKER = os.environ.get("PEER_CELERY_BROKER", "redis://127.0.0.1:6379/0")
DONE = "peer-celery:done"

app = Celery("peer", broker=BROKER)
app.conf.update(
    task_serializer="json",
    accept_content=["json"],
    task_ignore_result=True,
    worker_hijack_root_logger=False,
    broker_connection_retry_on_startup=True,
)
_spans: list[tuple[float, float, float]] = []
_lock = threading.Lock()
_redis = Redis.from_url(BROKER)


@app.task(name="noop")
def noop(due: float) -> None:
    started = time.time()
    _redis.incr(DONE)
    with _lock:
        _spans.append((due, started, time.time()))


@worker_shutdown.connect
def _write_spans(**_: Any) -> None:
    path = os.environ.get("PEER_CELERY_SPANS")
    if path:
        Path(f"{path}.{os.getpid()}").write_text(json.dumps(_spans))
