"""What the pages say of what they do not control: a schedule's queue job in Redis, a
PostgreSQL or Redis that does not answer (a 503 page naming it, never a bare 500), and the
values users wrote (their bidirectional controls escaped)."""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from typing import Any, Protocol, TypeVar

from markupsafe import Markup
from starlette.requests import Request
from starlette.responses import Response

from duejobs.delivery import JobState
from duejobs.errors import outage
from duejobs.models import Schedule, Status
from duejobs.terminal import bidi_escaped

log = logging.getLogger("duejobs.dashboard")


def shown(value: Any) -> Any:
    """A value as every page shows it (the templates' ``finalize``): text with its
    bidirectional controls escaped, as the CLI shows them, before HTML escaping — a key or a
    payload cannot make the page read another way round."""
    if not isinstance(value, str):
        return value
    escaped = bidi_escaped(value)
    return Markup(escaped) if isinstance(value, Markup) else escaped


class _Renders(Protocol):
    def render(
        self, request: Request, template: str, status: int = 200, **values: Any
    ) -> Response: ...


P = TypeVar("P", bound=_Renders)


def answering_outages(page: Callable[[P, Request], Response]) -> Callable[[P, Request], Response]:
    """A page that, with PostgreSQL or Redis out of reach, answers 503 naming which (and
    why) rather than a bare 500."""

    @functools.wraps(page)
    def guarded(self: P, request: Request) -> Response:
        try:
            return page(self, request)
        except Exception as exc:
            said = outage(exc)  # None for an error that is no outage: raised
            if said is None:
                raise
        log.warning("dashboard page %s: %s", request.url.path, said)
        return self.render(request, "unavailable.html", status=503, said=said)

    return guarded


def job_note(schedule: Schedule, job: JobState | str | None) -> str:
    """What is true of a schedule's queue job, for its state: a finished schedule's job is a
    record, a live one's is waiting, running, or lost (the reconciler's to push again)."""
    if isinstance(job, str):
        return job
    if job is None:
        return (
            "not pushed yet: the scheduler pushes it as it comes due"
            if (schedule.status.is_live)
            else "none"
        )
    said = "no job in Redis" if job.status is None else f"RQ status {job.status} on {job.origin}"
    if job.worker:
        said += f", worker {job.worker}"
    if not schedule.status.is_live:
        if job.live:
            return f"{said}; a worker that takes it skips it: the schedule is {schedule.status}"
        return f"{said}; the schedule is {schedule.status}: nothing more is done with it"
    if job.live:
        return f"{said}; a worker can take it"
    if schedule.status is Status.RUNNING and job.status == "started":
        return f"{said}; running (a dead worker's is rescued once its lease ends)"
    return f"{said}; lost: the reconciler pushes it again"
