"""What the RQ side of a worker asks of the code that runs deliveries: the :class:`Performer`
(the worker's runtime, :class:`~duejobs.worker.Runtime`) and its :class:`Slots` (the slot pool,
:class:`~duejobs.worker.slot_pool.SlotPool`). Stated here, as protocols, so that the RQ
adapter depends on no worker module: the worker builds on delivery, never the reverse."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Protocol

from duejobs.delivery.deliverer import Deliverer
from duejobs.models import Delivery


@dataclass(frozen=True)
class Delivered:
    """What handling one delivery came to: the outcome (the RQ job's result), and when to
    put the job back into its scheduled registry (None: it is done)."""

    outcome: str
    put_back_at: datetime | None = None


class Slots(Protocol):
    """A worker's slots: one job at a time each, a slot held from before its job is taken."""

    on_idle: Callable[[], None]

    @property
    def size(self) -> int: ...

    @property
    def busy(self) -> int: ...

    def acquire(self, timeout: float = ...) -> bool: ...

    def acquire_free(self) -> int: ...

    def release(self, count: int = 1) -> None: ...

    def took(self, keys: list[str]) -> None: ...

    def taken_at(self, key: str) -> float | None: ...

    def drop(self, key: str) -> None: ...

    def await_others(self, stopping: Callable[[], bool]) -> None: ...

    def run(self, key: str, work: Callable[[], None]) -> None: ...

    def close(self) -> None: ...


class Performer(Protocol):
    """What runs deliveries for a :class:`~duejobs.delivery.DuejobsWorker`."""

    @property
    def slots(self) -> Slots | None:
        """The slot pool; None: one job at a time, in the main thread."""
        ...

    @property
    def default_queue(self) -> str: ...

    @property
    def switch_interval(self) -> float:
        """The interpreter's switch interval (seconds) while slots work."""
        ...

    @property
    def lease(self) -> float:
        """Seconds a claim holds its row before the reconciler may rescue it."""
        ...

    def redis_url_for(self, queues: Sequence[str]) -> str:
        """The Redis node the queues live on (refused when they live on several)."""
        ...

    def deliverer(self) -> Deliverer: ...

    def claim_ahead(self, deliveries: Sequence[Delivery]) -> None:
        """Claim together deliveries taken together, before their slots run them."""
        ...

    def forget_ahead(self, delivery: Delivery) -> None:
        """Drop the claim made ahead of a copy of a delivery no slot will run."""
        ...

    def deliver(self, delivery: Delivery) -> Delivered: ...
