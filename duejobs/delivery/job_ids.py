"""Reading duejobs' RQ job ids back: ``dj-<tenant>-<schedule hex>-v<version>-a<attempt>``
(the store builds them with the row; see :mod:`duejobs.delivery`), and how long a job may be
taken before its row is claimed."""

from __future__ import annotations

import re
import uuid
from datetime import timedelta

# A row overdue by more than this whose job is not on its queue or in its scheduled registry is
# missing, whatever its job hash says: no live worker waits that long between taking a job
# from Redis and claiming its row (the claim's lock wait is bounded, an early delivery waits at
# most a second). A worker merely slow there meets a second delivery, which it skips.
STUCK_AFTER = timedelta(seconds=15)


def job_tenant_part(tenant: str) -> str:
    """How a tenant is spelled inside job ids (RQ allows no ``.``)."""
    return tenant.replace(".", "_")


_JOB_ID = re.compile(r"dj-(?P<tenant>[A-Za-z0-9_-]+)-(?P<id>[0-9a-f]{32})-v(?P<v>\d+)-a(?P<a>\d+)")


def job_tenant(queue_job_id: str) -> str | None:
    """The tenant part of a duejobs job id (see :func:`job_tenant_part`); None for others."""
    match = _JOB_ID.fullmatch(queue_job_id)
    return None if match is None else match["tenant"]


def parse_job_id(queue_job_id: str) -> tuple[uuid.UUID, int, int] | None:
    """(schedule id, version, attempt) of a duejobs job id; None for anything else."""
    match = _JOB_ID.fullmatch(queue_job_id)
    if match is None:
        return None
    return uuid.UUID(match["id"]), int(match["v"]), int(match["a"])
