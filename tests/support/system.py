"""One scheduler and one in-process worker over the test App: what most tests drive."""

from __future__ import annotations

import time
from collections.abc import Callable

import redis
from sqlalchemy import text

from duejobs import App
from duejobs.scheduler.loop import PassResult, Scheduler
from duejobs.worker import Runtime, Worker


class System:
    """One scheduler and one in-process worker over the test App."""

    def __init__(self, app: App, scheduler: Scheduler, runtime: Runtime, redis_client: redis.Redis):
        self.app = app
        self.scheduler = scheduler
        self.runtime = runtime
        self.redis = redis_client

    def scheduler_pass(self) -> PassResult:
        """What the running scheduler does: its recurring loop's pass, then its claims'."""
        self.scheduler.recurring.run_once()
        return self.scheduler.run_once()

    def work(self) -> None:
        """A worker (this process) that drains the queue and returns."""
        Worker(self.runtime).work(burst=True)

    def run_until(self, done: Callable[[], bool], timeout: float = 20.0) -> None:
        """Scheduler pass, then worker drain, until ``done()`` or the deadline."""
        deadline = time.monotonic() + timeout
        while not done():
            assert time.monotonic() < deadline, "deadline passed before the work was done"
            self.scheduler_pass()
            self.work()
            time.sleep(0.02)

    def effects(self) -> list[tuple[str, int]]:
        with self.app.engine.connect() as conn:
            rows = conn.execute(text("SELECT effect_key, attempt FROM test_effects ORDER BY id"))
            return [(r.effect_key, r.attempt) for r in rows]

    def status(self, schedule_id: object) -> str:
        s = self.app.get(schedule_id)  # type: ignore[arg-type]
        assert s is not None
        return s.status.value
