"""How many connections a worker process holds to PostgreSQL, end to end: its slots share a
bounded pool of bookkeeping connections (``MAX_CONNECTIONS``) beside the heartbeat's own,
whatever the slot count — each connection of a service named in ``pg_stat_activity``
("duejobs worker"). Forty-eight slots through 240 jobs of 0.2 s, finishing in waves: the
server never sees more than that bound from the worker. Seen failing against
bookkeeping that kept each step's connection open rather than lending it to the next (34
seen). (A worker process and 240 short jobs: about 3 s.)"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable

from sqlalchemy import text

from duejobs import App
from duejobs.worker.bookkeeping import MAX_CONNECTIONS
from tests.support import wait_for
from tests.support.processes import Proc
from tests.support.system import System

_NAMED = (
    "SELECT count(*) FROM pg_stat_activity "
    "WHERE application_name = 'duejobs worker' AND datname = current_database()"
)


def test_a_worker_with_many_slots_holds_a_bounded_number_of_connections(
    system: System, app: App, spawn: Callable[..., Proc], database_url: str, redis_url: str
) -> None:
    with contextlib.closing(App(database_url, redis_url)) as producer:  # no handlers here
        ids = [producer.schedule("nap", {"seconds": 0.2}, delay=0).id for _ in range(240)]
    system.scheduler.run_once()
    seen: list[int] = []
    done = threading.Event()

    def watch() -> None:
        with app.engine.connect() as conn:
            while not done.is_set():
                seen.append(int(conn.execute(text(_NAMED)).scalar_one()))
                conn.commit()
                done.wait(0.02)

    watcher = threading.Thread(target=watch)
    watcher.start()
    worker = spawn(
        "worker", "--app", "tests.support.light_app:app", "--concurrency", "48", "--burst"
    )
    try:
        assert worker.popen.wait(60) == 0, worker.output()
        wait_for(lambda: all(system.status(i) == "succeeded" for i in ids), 10, "the naps")
    finally:
        done.set()
        watcher.join()
    assert max(seen) >= 1, seen  # the worker's connections were seen, by their name
    assert max(seen) <= MAX_CONNECTIONS + 1, max(seen)  # the bookkeeping's, the heartbeat's
