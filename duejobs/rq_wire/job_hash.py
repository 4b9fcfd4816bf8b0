"""A duejobs job as RQ's hash holds it: the fields written at a push, the delivery read back
at a take, and a run's result as RQ's results stream holds one.

A job carries ids and the version, never the payload: its ``data`` is RQ's JSON of
``[function, instance, args, kwargs]`` with args ``[schedule id, version, attempt, tenant]``,
so a Redis writer cannot get code executed by unpickling, and the worker re-reads the row.

What it promises: what RQ 2.0 to 3.0 read as one of their jobs (``Job.fetch``, the
registries, rq-dashboard; ``tests/test_rq_api.py``). What it does not: keep RQ's optional
fields RQ reads the same when missing (an empty field is not written).
"""

from __future__ import annotations

import base64
import contextlib
import json
import uuid
import zlib
from typing import Any

from rq import Queue
from rq.results import Result

from duejobs.models import Delivery
from duejobs.rq_wire.bands import queue_of

JOB_FUNCTION = "duejobs.worker.perform"
# What :meth:`~duejobs.delivery.Deliverer.job_state` reads of a job hash.
JOB_FIELDS = ("status", "origin", "worker_name")


def constant_fields(queue: Queue, result_ttl: int) -> list[Any]:
    """The job-hash fields RQ writes that are the same for every duejobs job on ``queue``,
    flat (name, value, ...) as a script's arguments; ``result_ttl``: seconds a finished or
    failed job stays."""
    job = queue.create_job(
        JOB_FUNCTION,
        args=["-", 0, 0, "-"],
        timeout=-1,
        result_ttl=result_ttl,
        failure_ttl=result_ttl,
    )
    job.origin = queue.name
    fields = job.to_dict()
    for varying in ("data", "description", "created_at", "status", "enqueued_at"):
        fields.pop(varying, None)
    flat: list[Any] = []
    for name, value in fields.items():
        if value != "":  # RQ reads a missing field exactly like an empty one
            flat += [name, value]
    return flat


def job_data(delivery: Delivery) -> str:
    """RQ's job data: the JSON of (function, instance, args, kwargs). RQ reads it
    uncompressed as well as zlib-compressed; skipping zlib saves most of the cost.
    Formatted directly: a UUID, two ints and a tenant (``[A-Za-z0-9_.-]``, checked on the way
    in) need no JSON escaping."""
    return (
        f'["{JOB_FUNCTION}",null,["{delivery.schedule_id}",{delivery.version},'
        f'{delivery.attempt},"{delivery.tenant}"],{{}}]'
    )


def delivery_of(data: bytes | str, queue: str) -> Delivery:
    """The delivery a duejobs job's ``data`` carries (as :func:`job_data` writes it;
    zlib-compressed if RQ wrote it), taken from the RQ queue ``queue`` (a band of its
    schedule's queue)."""
    raw = data.encode() if isinstance(data, str) else data
    with contextlib.suppress(zlib.error):
        raw = zlib.decompress(raw)
    _function, _instance, args, _kwargs = json.loads(raw)
    schedule_id, version, attempt, tenant = args
    home = queue_of(queue)  # the schedule's queue, whichever band its job came on
    return Delivery(uuid.UUID(str(schedule_id)), str(tenant), int(version), int(attempt), home)


def result_entry(outcome: str | None, error: str | None) -> tuple[int, str, str]:
    """A run's entry in RQ's results stream: (result type, field, value) — the outcome
    (``succeeded``, ``skipped``...) as the job's return value, or the error."""
    if error is None:
        value = base64.b64encode(json.dumps(outcome).encode()).decode()
        return Result.Type.SUCCESSFUL.value, "return_value", value
    value = base64.b64encode(zlib.compress(error.encode())).decode()
    return Result.Type.FAILED.value, "exc_string", value
