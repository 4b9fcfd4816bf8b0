"""The operator's dashboard: an ASGI app (Starlette) to mount or to run with
``duejobs dashboard``.

Pages: the overview (the figures of ``duejobs stats``: counts by state, lag percentiles over
the last hour, late and overdue, schedules without a job and jobs without a schedule, per
tenant and per type, in flight against quotas; it reloads itself every ``refresh`` seconds),
the schedules (``App.list``'s filters and pages), and one schedule (its row and every event),
with its actions: cancel, reschedule, retry, run now (and pause or resume a recurring one).

What it promises:

* **Read-only unless actions are enabled**, and actions only for an authenticated caller:
  HTTP basic auth (``Access.user``/``password``) or the host application's own check
  (``Access.authorize``, called with each request). Every form carries a CSRF token bound to
  the caller (an HMAC under a secret of this process), and a POST without it, or from
  another origin, is refused.
* **Every value is HTML-escaped** (Jinja2's autoescape): payloads, keys and errors are user
  data.
* **A tenant-scoped App shows its tenant only**: every read and action goes through the
  App, whose scope the store applies.
* **Works offline**: one stylesheet shipped in the package, no script from elsewhere, no build
  step.

What it does not do: serve on a non-loopback address without authentication —
:func:`is_loopback` is what ``duejobs dashboard`` checks before it starts.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import inspect
import ipaddress
import secrets
import threading
import time
import uuid
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from importlib.resources import files
from typing import Any
from urllib.parse import parse_qs, urlencode

from jinja2 import Environment, PackageLoader, select_autoescape
from redis.exceptions import RedisError
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.middleware import Middleware
from starlette.middleware.trustedhost import TrustedHostMiddleware
from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response
from starlette.routing import Route

from duejobs import App, stats, store
from duejobs.delivery import JobState
from duejobs.errors import (
    ConfigurationError,
    DatabaseUnavailableError,
    DuejobsError,
    InvalidScheduleError,
)
from duejobs.models import Schedule, Status
from duejobs.timespec import parse_duration

_ACTIONS = ("cancel", "retry", "run-now", "reschedule")
# How an async page runs a blocking call (the App's): Starlette's thread pool by default.
Offload = Callable[..., Awaitable[Any]]


@dataclass(frozen=True)
class Access:
    """Who may use the dashboard. ``user``/``password``: HTTP basic auth for every page
    (both non-empty); ``authorize``: the host application's own check, a plain function given
    each request, answering the caller's name (its own CSRF token), True (allowed, one token
    for all), or anything else to refuse; ``actions``: cancel, reschedule, retry, run now,
    pause and resume are offered (to an authenticated caller only)."""

    user: str | None = None
    password: str | None = field(default=None, repr=False)
    authorize: Callable[[Request], bool | str] | None = None
    actions: bool = False

    def __post_init__(self) -> None:
        if self.authorize is not None and inspect.iscoroutinefunction(self.authorize):
            raise TypeError("Access.authorize must be a plain function (it runs in a thread)")

    @property
    def authenticates(self) -> bool:
        return self.authorize is not None or (bool(self.user) and bool(self.password))


def is_loopback(host: str) -> bool:
    """Whether ``host`` (an address or ``localhost``) is only reachable from this machine."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _basic_user(request: Request) -> tuple[str, str] | None:
    scheme, _, encoded = request.headers.get("authorization", "").partition(" ")
    if scheme.lower() != "basic":
        return None
    try:
        user, sep, password = base64.b64decode(encoded, validate=True).decode().partition(":")
    except (binascii.Error, UnicodeDecodeError):
        return None
    return (user, password) if sep else None


class Pages:
    """The dashboard's pages, each a method taking a Starlette request: routed by
    :func:`create_dashboard`, or by a host framework's own URLs (Django's, in
    ``duejobs.contrib.django.dashboard``)."""

    def __init__(
        self,
        app: App,
        access: Access,
        refresh: int,
        *,
        secret: bytes | None = None,
        offload: Offload = run_in_threadpool,
    ) -> None:
        self.app, self.access, self.refresh, self._offload = app, access, refresh, offload
        # Signs the CSRF tokens and the messages after actions: processes serving one
        # dashboard behind a balancer must share it, or a form fails on another process.
        self.secret = secret if secret is not None else secrets.token_bytes(32)
        self.figures = _Figures(app, refresh)
        self.pages = Environment(
            loader=PackageLoader("duejobs.dashboard", "templates"),
            autoescape=select_autoescape(default=True, default_for_string=True),
        )

    # -- access ----------------------------------------------------------------------------

    def caller(self, request: Request) -> str | None:
        """The authenticated caller's name, or None. The host's check answers True (one
        identity for everyone it lets in) or the caller's own name (a CSRF token each);
        anything else — False, None, an awaitable — refuses."""
        if self.access.authorize is not None:
            answer = self.access.authorize(request)
            if answer is True:
                return ""
            if isinstance(answer, str) and answer:
                return "user:" + answer
            return None
        given = _basic_user(request)
        if given is None or not self.access.user or not self.access.password:
            return None
        user_ok = hmac.compare_digest(given[0].encode(), self.access.user.encode())
        password_ok = hmac.compare_digest(given[1].encode(), self.access.password.encode())
        return given[0] if user_ok and password_ok else None

    def csrf(self, caller: str) -> str:
        return self._sign("csrf:" + caller)

    def _sign(self, text: str) -> str:
        return hmac.new(self.secret, text.encode(), hashlib.sha256).hexdigest()

    def _signed(self, request: Request, name: str) -> str | None:
        """A message this dashboard put in the redirect after an action (None for any
        other text: a link cannot make the page say something)."""
        text, sig = request.query_params.get(name), request.query_params.get("sig", "")
        if text is None or not hmac.compare_digest(sig.encode(), self._sign(text).encode()):
            return None
        return text

    def refused(self, request: Request) -> Response | None:
        """The answer to a caller who may not read, or None."""
        if self.access.authenticates and self.caller(request) is None:
            return Response(
                "authentication required",
                status_code=401,
                headers={"WWW-Authenticate": 'Basic realm="duejobs"'},
            )
        return None

    def render(self, request: Request, template: str, status: int = 200, **values: Any) -> Response:
        caller = self.caller(request)
        can_act = self.access.actions and caller is not None
        html = self.pages.get_template(template).render(
            root=request.scope.get("root_path", ""),
            scope=self.app.scope,
            can_act=can_act,
            csrf=self.csrf(caller) if can_act and caller is not None else "",
            **values,
        )
        return HTMLResponse(html, status_code=status, headers=_HEADERS)

    # -- pages -----------------------------------------------------------------------------

    def overview(self, request: Request) -> Response:
        if (no := self.refused(request)) is not None:
            return no
        figures, chart, age = self.figures.read()
        return self.render(
            request,
            "overview.html",
            figures=figures,
            chart=chart,
            refresh=self.refresh,
            stale=age if age > 3 * self.refresh else None,
        )

    def schedules(self, request: Request) -> Response:
        if (no := self.refused(request)) is not None:
            return no
        query = request.query_params
        filters = {
            name: query[name] or None
            for name in ("type", "tenant", "key", "queue", "after")
            if name in query
        }
        statuses = [s for s in query.getlist("status") if s]
        try:
            page = self.app.list(status=statuses or None, limit=50, **filters)  # type: ignore[arg-type]
            error = None
        except InvalidScheduleError as exc:
            page, error = None, str(exc)
        kept = [(k, v) for k, v in query.multi_items() if k != "after" and v]
        following = (
            "?" + urlencode([*kept, ("after", page.next_cursor)])
            if page is not None and page.next_cursor
            else None
        )
        return self.render(
            request,
            "schedules.html",
            status=400 if error else 200,
            page=page,
            error=error,
            query=dict(query),
            chosen=set(statuses),
            statuses=[s.value for s in Status],
            following=following,
        )

    def schedule(self, request: Request) -> Response:
        if (no := self.refused(request)) is not None:
            return no
        schedule_id = _id(request.path_params["schedule_id"])
        found = None if schedule_id is None else self.app.get(schedule_id)
        if found is None:
            return self.render(request, "missing.html", status=404)
        return self.render(
            request,
            "schedule.html",
            s=found,
            events=self.app.history(found.id),
            attempts=self.app.attempts(found.id),
            job=self._job(found),
            done=self._signed(request, "done"),
            failed=self._signed(request, "failed"),
        )

    def _job(self, schedule: Schedule) -> JobState | str | None:
        """The schedule's queue job in Redis, or why it cannot be read."""
        try:
            return stats.queue_job(self.app, schedule)
        except RedisError:
            return "Redis did not answer"
        except ConfigurationError:
            return "no Redis configured"

    async def _form(self, request: Request) -> dict[str, str] | Response:
        """The fields of an action's form — allowed only with actions enabled, an
        authenticated caller, the caller's CSRF token and no other origin — or the refusal."""
        caller = await self._offload(self.caller, request)
        if not self.access.actions or caller is None:
            return Response("actions are not enabled for this caller", status_code=403)
        origin = request.headers.get("origin")
        if origin is not None and origin != f"{request.url.scheme}://{request.url.netloc}":
            return Response("cross-origin request refused", status_code=403)
        form = parse_qs((await request.body()).decode("utf-8", "replace"))
        fields = {name: values[0] for name, values in form.items()}
        if not hmac.compare_digest(fields.get("csrf", "").encode(), self.csrf(caller).encode()):
            return Response("missing or wrong CSRF token", status_code=403)
        return fields

    def _after(self, request: Request, path: str, outcome: dict[str, str]) -> Response:
        """Back to ``path`` (GET), saying what the action came to in a signed message."""
        ((name, text),) = outcome.items()
        message = urlencode({name: text, "sig": self._sign(text)})
        root = request.scope.get("root_path", "")
        return RedirectResponse(f"{root}{path}?{message}", status_code=303)

    async def act(self, request: Request) -> Response:
        """POST /schedules/{id}/{cancel|retry|run-now}."""
        fields = await self._form(request)
        if isinstance(fields, Response):
            return fields
        action, schedule_id = request.path_params["action"], _id(request.path_params["schedule_id"])
        if action not in _ACTIONS or schedule_id is None:
            return Response("no such action", status_code=404)
        when = fields.get("when", "").strip()
        outcome = await self._offload(self._apply, action, schedule_id, when)
        return self._after(request, f"/schedules/{schedule_id}", outcome)

    def _apply(self, action: str, schedule_id: uuid.UUID, when: str = "") -> dict[str, str]:
        try:
            if action == "reschedule":
                self.app.reschedule(schedule_id, **_when(when))
            elif action == "cancel":
                if not self.app.cancel(schedule_id):
                    return {"failed": "not cancelled: it was not scheduled or running"}
            elif action == "retry":
                self.app.retry(schedule_id)
            else:
                self.app.run_now(schedule_id)
        except DatabaseUnavailableError:
            return {"failed": "the database is unavailable; nothing was changed"}
        except DuejobsError as exc:
            return {"failed": str(exc)}
        return {"done": action}

    def recurring(self, request: Request) -> Response:
        if (no := self.refused(request)) is not None:
            return no
        definitions = self.app.list_recurring()
        return self.render(
            request,
            "recurring.html",
            definitions=[(d, self.app.next_occurrences(d)) for d in definitions],
            quotas=self.app.quotas() if self.app.scope is None else [],  # its caps: overview
            done=self._signed(request, "done"),
            failed=self._signed(request, "failed"),
        )

    async def act_recurring(self, request: Request) -> Response:
        """POST /recurring: pause or resume the definition named in the form."""
        fields = await self._form(request)
        if isinstance(fields, Response):
            return fields
        action, name = fields.get("action"), fields.get("name", "")
        if action not in ("pause", "resume"):
            return Response("no such action", status_code=404)
        outcome = await self._offload(
            self._apply_recurring, action, name, fields.get("tenant") or None
        )
        return self._after(request, "/recurring", outcome)

    def _apply_recurring(self, action: str, name: str, tenant: str | None) -> dict[str, str]:
        try:
            if action == "pause":
                self.app.pause_recurring(name, tenant=tenant)
            else:
                self.app.resume_recurring(name, tenant=tenant)
        except DatabaseUnavailableError:
            return {"failed": "the database is unavailable; nothing was changed"}
        except DuejobsError as exc:
            return {"failed": str(exc)}
        return {"done": f"{action} {name}"}

    def stylesheet(self, request: Request) -> Response:
        css = files("duejobs.dashboard").joinpath("dashboard.css").read_text(encoding="utf-8")
        return Response(css, media_type="text/css", headers=_HEADERS)


def _when(text: str) -> dict[str, Any]:
    """A reschedule's new time as the form gives it: a delay from now (``30m``, ``1h30m``)
    or an ISO 8601 time with its offset."""
    if not text:
        raise InvalidScheduleError("give the new time: a delay such as 30m, or an ISO 8601 time")
    try:
        return {"run_at": datetime.fromisoformat(text)}
    except ValueError:
        return {"delay": parse_duration(text, "the new time")}


class _Figures:
    """The overview's figures, read at most once per ``refresh`` seconds whoever asks: they
    count every live schedule, which on a big table takes longer than a page should. A page
    asking for figures older than that gets them at once (they say when they were read) while
    one thread reads them again; only the very first page waits."""

    def __init__(self, app: App, refresh: int) -> None:
        self._app, self._refresh = app, refresh
        self._lock = threading.Lock()
        self._current: tuple[stats.Stats, _LagChart] | None = None
        self._read_at = 0.0
        self._reading = False

    def read(self) -> tuple[stats.Stats, _LagChart, float]:
        """The figures, their chart, and how many seconds ago they were read."""
        with self._lock:
            current, stale = self._current, time.monotonic() - self._read_at >= self._refresh
            start = current is not None and stale and not self._reading
            if start:
                self._reading = True
        if current is None:
            return (*self._read(), 0.0)
        if start:
            threading.Thread(target=self._read, name="duejobs-dashboard", daemon=True).start()
        return (*current, time.monotonic() - self._read_at)

    def _read(self) -> tuple[stats.Stats, _LagChart]:
        try:
            figures = stats.collect(self._app)
            chart = _LagChart.of(stats.lag_over_time(self._app), figures.at, figures.since)
            with self._lock:
                self._current, self._read_at = (figures, chart), time.monotonic()
            return figures, chart
        finally:
            with self._lock:
                self._reading = False


@dataclass(frozen=True)
class _LagChart:
    """The start lag over the last hour as SVG (p50 and p99 lines, a dot per minute): drawn
    by the browser from the page's markup, no script."""

    p50: list[tuple[float, float]]
    p99: list[tuple[float, float]]
    top_ms: float
    starts: int
    width: int = 720
    height: int = 160

    @classmethod
    def of(cls, points: list[store.LagPoint], now: datetime, span: timedelta) -> _LagChart:
        top = max([p.p99_ms for p in points] + [1.0])
        start = now - span

        def line(value: Callable[[store.LagPoint], float]) -> list[tuple[float, float]]:
            return [
                (
                    round((p.at - start) / span * cls.width, 1),
                    round(cls.height - 4 - value(p) / top * (cls.height - 8), 1),  # 4 px margin
                )
                for p in points
            ]

        return cls(
            line(lambda p: p.p50_ms), line(lambda p: p.p99_ms), top, sum(p.starts for p in points)
        )


# No script runs on these pages; frames, plugins and foreign resources are refused outright.
_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'none'; style-src 'self'; img-src 'self'; form-action 'self'; "
        "frame-ancestors 'none'; base-uri 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",
}


def _id(text: str) -> uuid.UUID | None:
    try:
        return uuid.UUID(text)
    except ValueError:
        return None


def create_dashboard(
    app: App,
    access: Access | None = None,
    *,
    refresh: int = 10,
    allowed_hosts: Sequence[str] | None = None,
    secret: bytes | None = None,
) -> Starlette:
    """The dashboard of ``app`` (a tenant-scoped App: of that tenant only), as an ASGI app.
    ``refresh``: seconds between the overview's reloads. ``allowed_hosts``: the only Host
    headers answered (``duejobs dashboard`` passes the address it serves, which keeps a web
    page that rebinds its own name to 127.0.0.1 from reading a loopback dashboard).
    ``secret``: the key of its CSRF tokens, to share between processes serving it (default:
    one of this process's own)."""
    board = Pages(app, access or Access(), refresh, secret=secret)
    middleware = []
    if allowed_hosts is not None:
        middleware.append(Middleware(TrustedHostMiddleware, allowed_hosts=list(allowed_hosts)))
    return Starlette(
        middleware=middleware,
        routes=[
            Route("/", board.overview),
            Route("/schedules", board.schedules),
            Route("/schedules/{schedule_id}", board.schedule),
            Route("/schedules/{schedule_id}/{action}", board.act, methods=["POST"]),
            Route("/recurring", board.recurring),
            Route("/recurring", board.act_recurring, methods=["POST"]),
            Route("/dashboard.css", board.stylesheet),
        ],
    )
