"""A delivery's RQ job id: ``dj-<tenant>-<schedule hex>-v<version>-a<attempt>``.

RQ allows only ``[A-Za-z0-9_-]`` in an id: a ``.`` in a tenant becomes ``_``
(:func:`job_tenant_part`), and the schedule id keeps it unique. The store builds the id with
the row (the claim's and the re-push's SQL spell it the same way), so the same (schedule,
version, attempt) always has the same job id — what keeps a second push from making a second
job (:mod:`duejobs.delivery`). This module reads ids back.
"""

from __future__ import annotations

import re
import uuid


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
