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
  the caller, the browser session and a lifetime (an HMAC under a secret of this process),
  and a POST without it, or from another origin, is refused (:mod:`.access`).
* **Without authentication, this machine only**: a request through a proxy or from another
  machine gets a page saying why, and no data.
* **Every value is HTML-escaped** (Jinja2's autoescape): payloads, keys and errors are user
  data.
* **A tenant-scoped App shows its tenant only**: every read and action goes through the
  App, whose scope the store applies.
* **Works offline**: one stylesheet shipped in the package, no script from elsewhere, no build
  step.

What it does not do: serve on a non-loopback address without authentication —
:func:`~duejobs.dashboard.access.is_loopback` is what ``duejobs dashboard`` checks before it
starts. Pages send ``Cache-Control: no-store``: what they show stays out of caches.
"""

from __future__ import annotations

import functools
import hmac
import json
import logging
import secrets
import uuid
from collections.abc import Awaitable, Callable, Sequence
from importlib.resources import files
from typing import Any
from urllib.parse import parse_qs, urlencode

from jinja2 import Environment, PackageLoader, select_autoescape
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.middleware import Middleware
from starlette.middleware.trustedhost import TrustedHostMiddleware
from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response
from starlette.routing import Route

from duejobs import App
from duejobs.dashboard import figures
from duejobs.dashboard.access import (
    PAGE_HEADERS,
    SESSION_COOKIE,
    SESSION_SCOPE,
    Access,
    SignIns,
    Tokens,
    basic_user,
    not_local,
    public_origin,
)
from duejobs.dashboard.figures import Figures, Shown
from duejobs.dashboard.inputs import number, schedule_id_in, when_given
from duejobs.dashboard.limits import one_page_at_most
from duejobs.dashboard.notes import answering_outages, job_note, shown
from duejobs.dashboard.rates import apply_rate_limit
from duejobs.delivery import JobState
from duejobs.errors import (
    ConfigurationError,
    DatabaseUnavailableError,
    DuejobsError,
    InvalidListError,
    InvalidScheduleError,
)
from duejobs.models import Schedule, Status
from duejobs.redis_urls import redis_failures
from duejobs.services import stats
from duejobs.validation import DEFAULT_TENANT

log = logging.getLogger("duejobs.dashboard")
_ACTIONS = ("cancel", "retry", "run-now", "reschedule")
# Events and attempts a schedule's page shows at once (newest first; older events a page on).
_HISTORY_PAGE = 50
# The query parameters of the schedules' list: its filters and its cursor.
_LIST_FILTERS = {"status", "type", "tenant", "key", "queue", "after"}
_FILTERS_SAID = "its filters: status, type, tenant, key, queue"
# How an async page runs a blocking call (the App's): Starlette's thread pool by default.
Offload = Callable[..., Awaitable[Any]]


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
        self.tokens = Tokens(
            secret if secret is not None else secrets.token_bytes(32), access.form_lifetime
        )
        self.sign_ins = SignIns(access.sign_in_limit)
        self.figures = Figures(app, refresh)
        self.pages = Environment(
            loader=PackageLoader("duejobs.dashboard", "templates"),
            autoescape=select_autoescape(default=True, default_for_string=True),
            finalize=shown,
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
        given = basic_user(request)
        if given is None or not self.access.user or not self.access.password:
            return None
        user_ok = hmac.compare_digest(given[0].encode(), self.access.user.encode())
        password_ok = hmac.compare_digest(given[1].encode(), self.access.password.encode())
        return given[0] if user_ok and password_ok else None

    def refused(self, request: Request) -> Response | None:
        """The answer to a caller who may not read, or None: without authentication, a
        request that did not come straight from this machine; with basic auth, a client
        that sent too many wrong passwords, or a caller without the credentials."""
        if not self.access.authenticates:
            why = not_local(request)
            if why is None:
                return None
            page = self.pages.get_template("refused.html").render(why=why)
            return HTMLResponse(page, status_code=403, headers=PAGE_HEADERS)
        client = request.client.host if request.client else ""
        forwarded = request.headers.get("x-forwarded-for")
        proxy = self.sign_ins.unknown_proxy(forwarded, client) if forwarded else ""
        if self.access.authorize is None and (wait := self.sign_ins.wait(client)):
            return Response(
                "too many failed sign-ins from this address: try again later" + proxy,
                status_code=429,
                headers={**PAGE_HEADERS, "Retry-After": str(int(wait))},
            )
        if self.caller(request) is None:
            if self.access.authorize is None and basic_user(request) is not None:
                self.sign_ins.failed(client)
            return Response(
                "authentication required",
                status_code=401,
                headers={**PAGE_HEADERS, "WWW-Authenticate": 'Basic realm="duejobs"'},
            )
        return None

    def _session(self, request: Request) -> str | None:
        """The browser session a form is bound to: the host framework's, else this
        dashboard's own cookie."""
        session = request.scope.get(SESSION_SCOPE) or request.cookies.get(SESSION_COOKIE)
        return str(session) if session else None

    def _signed(self, request: Request, name: str) -> str | None:
        """A message this dashboard put in the redirect after an action on this very page
        (None for any other text: a link cannot make a page say something)."""
        text, sig = request.query_params.get(name), request.query_params.get("sig", "")
        expected = self.tokens.sign(f"{_page(request)}:{name}:{text}")
        if text is None or not hmac.compare_digest(sig.encode(), expected.encode()):
            return None
        return text

    def render(self, request: Request, template: str, status: int = 200, **values: Any) -> Response:
        caller = self.caller(request)
        can_act = self.access.actions and caller is not None
        session = self._session(request)
        new_session = can_act and session is None
        caller = caller if can_act else None
        if new_session:
            session = Tokens.new_session()
        html = self.pages.get_template(template).render(
            root=request.scope.get("root_path", ""),
            scope=self.app.scope,
            can_act=can_act,
            csrf=self.tokens.csrf(caller, session)
            if can_act and caller is not None and session
            else "",
            **values,
        )
        answer = HTMLResponse(html, status_code=status, headers=PAGE_HEADERS)
        if new_session and session:
            answer.set_cookie(
                SESSION_COOKIE,
                session,
                path=request.scope.get("root_path") or "/",
                secure=request.url.scheme == "https",
                httponly=True,
                samesite="strict",
            )
        return answer

    # -- pages -----------------------------------------------------------------------------

    @answering_outages
    def overview(self, request: Request) -> Response:
        if (no := self.refused(request)) is not None:
            return no
        reading = self.figures.read()
        search = request.query_params.get("tenant", "").strip()
        page = request.query_params.get("page", "1")
        shown = Shown.of(reading.figures, search, number(page) or 1)
        return self.render(
            request,
            "overview.html",
            shown=shown,
            search=search,
            figures=reading.figures,
            chart=reading.chart,
            refresh=self.refresh,
            age=reading.age,
            failed=reading.failed,
        )

    @answering_outages
    def schedules(self, request: Request) -> Response:
        if (no := self.refused(request)) is not None:
            return no
        query = request.query_params
        unknown = ", ".join(sorted(set(query) - _LIST_FILTERS))
        filters = {
            name: query[name] or None
            for name in ("type", "tenant", "key", "queue", "after")
            if name in query
        }
        statuses = [s for s in query.getlist("status") if s]
        try:
            if unknown:  # said, rather than every schedule listed as if filtered
                raise InvalidListError(f"the list has no filter {unknown} ({_FILTERS_SAID})")
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
        unscoped_key = filters.get("key") and not filters.get("tenant") and self.app.scope is None
        key_tenant = DEFAULT_TENANT if unscoped_key else None
        return self.render(
            request,
            "schedules.html",
            key_tenant=key_tenant,
            status=400 if error else 200,
            page=page,
            error=error,
            query=dict(query),
            chosen=set(statuses),
            statuses=[s.value for s in Status],
            following=following,
        )

    @answering_outages
    def schedule(self, request: Request) -> Response:
        if (no := self.refused(request)) is not None:
            return no
        schedule_id = schedule_id_in(request.path_params["schedule_id"])
        found = None if schedule_id is None else self.app.get(schedule_id)
        if found is None:
            return self.render(request, "missing.html", status=404)
        before = request.query_params.get("before", "")
        events = self.app.history(found.id, newest=_HISTORY_PAGE + 1, before=number(before))
        return self.render(
            request,
            "schedule.html",
            s=found,
            events=events[:_HISTORY_PAGE],
            older=events[_HISTORY_PAGE - 1].id if len(events) > _HISTORY_PAGE else None,
            attempts=self.app.attempts(found.id, newest=_HISTORY_PAGE),
            page_size=_HISTORY_PAGE,
            job_note=job_note(found, self._job(found)),
            # The text as written (not JSON's \uXXXX escapes); escaped as HTML like the rest.
            payload=json.dumps(found.payload, indent=2, ensure_ascii=False),
            done=self._signed(request, "done"),
            failed=self._signed(request, "failed"),
        )

    def _job(self, schedule: Schedule) -> JobState | str | None:
        """The schedule's queue job in Redis, or why it cannot be read."""
        try:
            return stats.queue_job(self.app, schedule)
        except redis_failures():
            return "Redis did not answer"
        except ConfigurationError:
            return "no Redis configured"

    async def _form(self, request: Request) -> dict[str, str] | Response:
        """The fields of an action's form — allowed only with actions enabled, an
        authenticated caller, the caller's CSRF token of this session and no other origin —
        or the refusal."""
        no: Response | None = await self._offload(self.refused, request)
        if no is not None:
            return no
        caller = await self._offload(self.caller, request)
        if not self.access.actions or caller is None:
            return Response("actions are not enabled for this caller", status_code=403)
        origin = request.headers.get("origin")
        if origin is not None and origin not in self._origins(request):
            return Response("cross-origin request refused", status_code=403)
        form = parse_qs((await request.body()).decode("utf-8", "replace"))
        fields = {name: values[0] for name, values in form.items()}
        session = self._session(request)
        why = (
            self.tokens.csrf_refusal(fields.get("csrf", ""), caller, session)
            if session
            else "missing or wrong CSRF token"
        )
        if why is not None:
            return Response(why, status_code=403)
        return fields

    def _origins(self, request: Request) -> set[str]:
        """The origins a form may be posted from: the one the request was made to, and
        the public URL's behind a proxy that does not forward the Host."""
        own = {f"{request.url.scheme}://{request.url.netloc}"}
        if self.access.public_url is not None:
            own.add(public_origin(self.access.public_url)[0])
        return own

    def _after(self, request: Request, path: str, outcome: dict[str, str]) -> Response:
        """Back to ``path`` (GET), saying what the action came to in a signed message."""
        ((name, text),) = outcome.items()
        message = urlencode({name: text, "sig": self.tokens.sign(f"{path}:{name}:{text}")})
        root = request.scope.get("root_path", "")
        return RedirectResponse(f"{root}{path}?{message}", status_code=303)

    async def act(self, request: Request) -> Response:
        """POST /schedules/{id}/{cancel|retry|run-now}."""
        fields = await self._form(request)
        if isinstance(fields, Response):
            return fields
        action, schedule_id = (
            request.path_params["action"],
            schedule_id_in(request.path_params["schedule_id"]),
        )
        if action not in _ACTIONS or schedule_id is None:
            return Response("no such action", status_code=404)
        when = fields.get("when", "").strip()
        outcome = await self._offload(self._apply, action, schedule_id, when)
        return self._after(request, f"/schedules/{schedule_id}", outcome)

    def _apply(self, action: str, schedule_id: uuid.UUID, when: str = "") -> dict[str, str]:
        try:
            if action == "reschedule":
                self.app.reschedule(schedule_id, **when_given(when))
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

    def _caps_of(self, tenants: set[str]) -> list[Any]:
        """The quotas of the tenants a page lists (their use of them: the overview)."""
        return self.app.quotas(tenants) if self.app.scope is None else []

    @answering_outages
    def recurring(self, request: Request) -> Response:
        if (no := self.refused(request)) is not None:
            return no
        tenant = request.query_params.get("tenant") or None
        try:
            listed = self.app.list_recurring(tenant=tenant, limit=figures.RECURRING_ROWS + 1)
            error = None
        except InvalidScheduleError as exc:  # a tenant that cannot be one
            listed, error = [], str(exc)
        definitions = listed[: figures.RECURRING_ROWS]
        return self.render(
            request,
            "recurring.html",
            status=400 if error else 200,
            error=error,
            definitions=[(d, self.app.next_occurrences(d)) for d in definitions],
            more=len(listed) > figures.RECURRING_ROWS,
            rows=figures.RECURRING_ROWS,
            tenant=tenant,
            quotas=self._caps_of({d.tenant for d in definitions} | {tenant or "*"}),
            rate_limits=self.app.rate_limits() if self.app.scope is None else None,
            done=self._signed(request, "done"),
            failed=self._signed(request, "failed"),
        )

    async def act_recurring(self, request: Request) -> Response:
        """POST /recurring: pause or resume the definition named in the form, or set a
        rate limit (an unscoped dashboard's)."""
        fields = await self._form(request)
        if isinstance(fields, Response):
            return fields
        action, name = fields.get("action"), fields.get("name", "")
        if action == "rate-limit" and self.app.scope is None:
            outcome = await self._offload(
                apply_rate_limit, self.app, fields.get("scope", ""), name, fields.get("rate", "")
            )
            return self._after(request, "/recurring", outcome)
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

    async def stylesheet(self, request: Request) -> Response:
        """Served on the event loop, from memory: never behind pages waiting for threads,
        connections or locks."""
        return Response(_stylesheet(), media_type="text/css", headers=PAGE_HEADERS)


@functools.cache
def _stylesheet() -> str:
    return files("duejobs.dashboard").joinpath("dashboard.css").read_text(encoding="utf-8")


def _page(request: Request) -> str:
    """The request's path under the dashboard's root (``/schedules/<id>``)."""
    path: str = request.scope["path"]
    root: str = request.scope.get("root_path", "")
    return path[len(root) :] if root and path.startswith(root) else path


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
            Route("/", one_page_at_most(board.overview)),
            Route("/schedules", one_page_at_most(board.schedules)),
            Route("/schedules/{schedule_id}", one_page_at_most(board.schedule)),
            Route("/schedules/{schedule_id}/{action}", board.act, methods=["POST"]),
            Route("/recurring", one_page_at_most(board.recurring)),
            Route("/recurring", board.act_recurring, methods=["POST"]),
            Route("/dashboard.css", board.stylesheet),
        ],
    )
