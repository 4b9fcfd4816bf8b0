"""Deliveries as tests make them: a job id spelled as the README documents it, a push of any
version and attempt."""

from __future__ import annotations

import uuid

from duejobs import Schedule
from duejobs.delivery import Push
from duejobs.models import Delivery


def job_id(tenant: str, schedule_id: uuid.UUID, version: int, attempt: int) -> str:
    """A delivery's RQ job id as the README documents it."""
    return f"dj-{tenant.replace('.', '_')}-{schedule_id.hex}-v{version}-a{attempt}"


def push_of(s: Schedule, version: int = 1, attempt: int = 1) -> Push:
    """A push of ``s`` at any version and attempt, as no claim would make it: a stray or
    second copy of a delivery."""
    spelled = job_id(s.tenant, s.id, version, attempt)
    return Push(Delivery(s.id, s.tenant, version, attempt, s.queue, s.due_at, spelled))
