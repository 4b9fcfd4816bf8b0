"""Reading duejobs' RQ job ids back: ``dj-<tenant>-<schedule hex>-v<version>-a<attempt>``
(the store builds them with the row; see :mod:`duejobs.delivery`)."""

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
