"""The checks every schedule request passes before anything is written: its type, tenant,
queue, key, payload, time, jitter and expiry — each refusal an
:class:`~duejobs.errors.InvalidScheduleError` naming what is wrong."""

from __future__ import annotations

from datetime import timedelta
from typing import NamedTuple

from duejobs import store
from duejobs.app.scope import Scoped
from duejobs.errors import InvalidScheduleError, UnknownTypeError
from duejobs.handlers import Handler
from duejobs.models import ScheduleRequest
from duejobs.timespec import as_delay, parse_when
from duejobs.validation import check_key, check_type, payload_encoder

_NO_JITTER = timedelta(0)


class Placement(NamedTuple):
    """Where a schedule goes: its checked type and tenant, the type's registration, its queue."""

    job_type: str
    tenant: str
    handler: Handler | None
    queue: str


def registration(app: Scoped, job_type: str) -> Handler | None:
    """The handler registered for ``job_type`` in this App, None if there is none; refused
    (:class:`UnknownTypeError`) when the App refuses unknown types."""
    handler = app.handler_for(job_type)
    if handler is None and app.core.refuses_unknown_types():
        known = ", ".join(sorted(app.core.handlers)) or "none"
        raise UnknownTypeError(
            f"no handler for type {job_type!r} in this App (its types: {known}); a producer "
            "that schedules another service's types is made with App(strict_types=False)"
        )
    return handler


def _placement(app: Scoped, request: ScheduleRequest) -> Placement:
    """The request's checked type, tenant, registration and queue."""
    job_type = check_type(request.type)
    tenant = app._write_tenant(request.tenant)
    handler = registration(app, job_type)
    return Placement(job_type, tenant, handler, app._route(handler, request.queue))


class RequestChecks:
    """Every check :meth:`~duejobs.App.schedule` makes, for the requests of one call.

    What repeats across a batch is checked once: each (type, tenant, queue)'s checks and
    registration are kept (a batch has few), and one JSON encoder serves every payload. One
    batch, one thread: a refused request ends the batch (the encoder is then left dirty)."""

    def __init__(self, app: Scoped) -> None:
        self._app = app
        self._seen: dict[tuple[object, object, object], Placement] = {}
        self._encode = payload_encoder(app.core.max_payload_bytes)

    def row(self, request: ScheduleRequest) -> store.NewRow:
        """The row to insert for a request, or the error that names what is wrong with it."""
        if not isinstance(request, ScheduleRequest):
            raise InvalidScheduleError(
                f"expected a duejobs.ScheduleRequest, got {type(request).__name__}"
            )
        where = (request.type, request.tenant, request.queue)
        try:
            placement = self._seen.get(where)
        except TypeError:  # unhashable, so not a str: the checks say what is wrong
            placement = None
        if placement is None:
            placement = _placement(self._app, request)
            if len(self._seen) < 1024:
                self._seen[where] = placement
        job_type, tenant, handler, route = placement
        key = check_key(request.key)
        payload_json = self._encode(request.payload)
        when = parse_when(delay=request.delay, run_at=request.run_at, timezone=request.timezone)
        if request.jitter is None:
            spread = handler.jitter if handler else _NO_JITTER
        else:
            spread = as_delay(request.jitter, "jitter")
        expiry = request.expires_after
        return store.NewRow(  # positional: a third cheaper, and this runs once per row
            tenant,
            job_type,
            key,
            payload_json,
            when,
            spread,
            None if expiry is None else as_delay(expiry, "expires_after"),
            handler.retry.max_attempts if handler else None,
            route,
        )
