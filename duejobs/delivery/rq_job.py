"""A duejobs job as the worker's RQ side runs it (:class:`DeliveryJob`): its arguments are a
:class:`~duejobs.models.Delivery` handed to the worker's performer, never an import of the
function the job names.

RQ's private state read here, where RQ offers no public way (checked against RQ 2.0, 2.6 and
3.0): a job's ``_status`` and ``_result``, which its save writes (RQ's own ``save`` reads
them the same way).
"""

from __future__ import annotations

import contextlib
import uuid
from datetime import datetime
from typing import Any, ClassVar, TypeVar

from redis import Redis
from redis.client import Pipeline
from redis.typing import EncodableT, FieldT
from rq.job import Job
from rq.registry import BaseRegistry, FailedJobRegistry, FinishedJobRegistry, StartedJobRegistry
from rq.serializers import JSONSerializer
from rq.timeouts import BaseDeathPenalty
from rq.utils import as_text, str_to_date, utcformat

from duejobs.delivery._rq_compat import NAIVE_TIMESTAMPS
from duejobs.delivery.performer import Delivered, Performer
from duejobs.models import Delivery

_Registry = TypeVar("_Registry", bound=BaseRegistry)


class DeliveryJob(Job):
    """A duejobs job as a :class:`DuejobsWorker` runs it: its arguments go to the worker's
    performer (never through an import of the function the job names), and what came of it
    stays on the job for :meth:`DuejobsWorker.handle_job_success`.

    Some of RQ's per-job costs are cut without changing what RQ reads or writes: a job's
    registries (RQ builds one, checking its serializer, at each use) are shared by the
    worker's jobs of one queue, which have one connection and one serializer; the worker's
    own serializer is not checked again for each job read; a job's timestamps are read with
    the standard library's ISO parser instead of ``strptime`` (the same values); and its
    finish writes the fields of the job's hash that its run changed, where RQ writes the whole
    hash again (its data serialized and compressed anew, unchanged). A hash that vanished
    while its job ran (evicted, or deleted by hand) is therefore left holding those fields
    alone until its result's time to live ends, where RQ would write it whole again: duejobs
    counts such a job as absent (its row, not the hash, says what became of the delivery)."""

    performer: ClassVar[Performer]
    registries: ClassVar[dict[tuple[type[BaseRegistry], str], BaseRegistry]]
    delivered: Delivered | None = None
    finishing: bool = False  # within the worker's finish of a job that ran

    def __init__(
        self, id: str | None = None, connection: Redis | None = None, serializer: Any = None
    ) -> None:
        # RQ checks the serializer of each job it makes (a slow Protocol isinstance on Python
        # 3.11); the worker's own was checked when the worker started.
        if serializer is not JSONSerializer:
            super().__init__(id, connection=connection, serializer=serializer)
            return
        super().__init__(id, connection=connection)
        self.serializer = serializer

    def restore(self, raw_data: dict[Any, Any]) -> Any:
        """RQ's restore, its timestamps parsed by :func:`_timestamp`."""
        rest, stamps = {}, {}
        for field, value in raw_data.items():
            name = as_text(field)
            if name in _TIMESTAMPS and value:
                stamps[name] = value
            else:
                rest[field] = value
        restored = super().restore(rest)
        for name, value in stamps.items():
            setattr(self, name, _timestamp(value))
        return restored

    def _execute(self) -> Any:
        self.delivered = self.performer.deliver(delivery_of(self))
        return self.delivered.outcome

    def _shared(self, kind: type[_Registry]) -> _Registry:
        key = (kind, self.origin)
        found = self.registries.get(key)
        if found is None:
            found = kind(
                self.origin,
                connection=self.connection,
                job_class=type(self),
                serializer=self.serializer,
            )
            self.registries[key] = found
        assert isinstance(found, kind)
        return found

    @property
    def started_job_registry(self) -> StartedJobRegistry:
        return self._shared(StartedJobRegistry)

    @property
    def finished_job_registry(self) -> FinishedJobRegistry:
        return self._shared(FinishedJobRegistry)

    @property
    def failed_job_registry(self) -> FailedJobRegistry:
        return self._shared(FailedJobRegistry)

    def save(
        self,
        pipeline: Pipeline | None = None,
        include_meta: bool = True,
        include_result: bool = True,
    ) -> None:
        """RQ's save; in the finish of a job that ran, only the fields its run changed."""
        if not self.finishing or include_meta or (include_result and self._result is not None):
            super().save(pipeline, include_meta, include_result)
            return
        values = {
            "status": self._status,
            "started_at": self.started_at,
            "ended_at": self.ended_at,
            "last_heartbeat": self.last_heartbeat,
            "worker_name": self.worker_name,
        }
        mapping: dict[FieldT, EncodableT] = {
            name: utcformat(value) if isinstance(value, datetime) else (value or "")
            for name, value in values.items()
        }
        (pipeline if pipeline is not None else self.connection).hset(self.key, mapping=mapping)


# The fields of a job's hash RQ writes with ``utcformat`` and reads back with ``strptime``.
_TIMESTAMPS = frozenset({"created_at", "enqueued_at", "started_at", "ended_at", "last_heartbeat"})


def _timestamp(value: bytes | str) -> datetime:
    """A timestamp RQ wrote (``2026-12-03T12:02:46.584293Z``, or without the fraction), read
    as this RQ reads it (UTC, aware or naive) in a fortieth of the time; anything else as RQ
    reads it."""
    text = as_text(value)
    if text.endswith("Z"):
        with contextlib.suppress(ValueError):
            parsed = datetime.fromisoformat(text)  # "Z" is read as UTC since Python 3.11
            return parsed.replace(tzinfo=None) if NAIVE_TIMESTAMPS else parsed
    as_rq_reads: datetime = str_to_date(text.encode())  # RQ 2.0's takes bytes alone
    return as_rq_reads


def delivery_of(job: Job) -> Delivery:
    """A duejobs job's delivery: its arguments (schedule id, version, attempt, tenant) and
    its queue."""
    schedule_id, version, attempt, tenant = job.args
    return Delivery(
        uuid.UUID(str(schedule_id)), str(tenant), int(version), int(attempt), job.origin
    )


def read_delivery(job: Job) -> Delivery | None:
    """The delivery of a job taken; None for a job that is not one, or whose arguments cannot
    be read (its run says so)."""
    try:
        return delivery_of(job)
    except Exception:
        return None


class NoDeathPenalty(BaseDeathPenalty):
    """RQ's job timeout, off in a concurrent worker's slots: RQ's default arms ``SIGALRM``,
    which only the main thread may; the delivery enforces its handler's own timeout."""

    def setup_death_penalty(self) -> None:
        pass

    def cancel_death_penalty(self) -> None:
        pass
