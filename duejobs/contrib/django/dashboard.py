"""The dashboard in a Django project's own URLs, behind Django's own sign-in.

Setup (``django.contrib.auth`` with its sessions and middleware, and the ``dashboard``
extra: without it, importing this module raises ``ImproperlyConfigured`` naming it)::

    # urls.py
    from django.urls import include, path
    from duejobs.contrib.django.dashboard import dashboard_urls

    urlpatterns = [path("jobs/", include(dashboard_urls(actions=True)))]

Who may see it: a signed-in user that ``allow`` accepts — by default an active staff user;
another signed-in user is answered 403; anyone else is sent to sign in: to
``settings.LOGIN_URL`` where the project routes it, else to the admin's sign-in page.
``actions`` offers cancel, reschedule, retry, run now, pause and resume. The pages are those
of ``duejobs dashboard`` (:mod:`duejobs.dashboard`), routed by Django: each view runs its
page in the request's own thread, so its reads and writes go through the project's App on
Django's connection, as a view's would. The forms carry the dashboard's own CSRF token,
bound to the user and to Django's session (a form shown before a sign-out is refused after
it); Django's CSRF middleware is not asked to check them (the views are ``csrf_exempt``).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

from django.core.exceptions import ImproperlyConfigured

try:  # the dashboard extra's packages, named when missing (urls.py imports this module)
    from starlette.requests import Request
    from starlette.responses import Response

    from duejobs.dashboard import Access, Pages
    from duejobs.dashboard.access import SESSION_SCOPE
except ImportError as exc:
    raise ImproperlyConfigured(
        "duejobs.contrib.django.dashboard needs the dashboard extra (in a checkout: pip "
        f"install '.[binary,django,dashboard]'): {exc}"
    ) from exc

from asgiref.sync import async_to_sync, sync_to_async
from django.contrib.auth.views import redirect_to_login
from django.http import HttpRequest, HttpResponse, HttpResponseForbidden
from django.urls import URLPattern, path
from django.utils.crypto import salted_hmac
from django.views.decorators.csrf import csrf_exempt

from duejobs.contrib.django import get_app

_USER = "duejobs.user"  # the scope key the views put the signed-in user's name under


def _staff(user: Any) -> bool:
    return bool(user.is_active and user.is_staff)


def dashboard_urls(
    *, actions: bool = False, allow: Callable[[Any], bool] = _staff, refresh: int = 10
) -> list[URLPattern]:
    """The dashboard's URL patterns, for ``include()``. ``allow``: which signed-in users may
    use it (default: active staff)."""
    built: list[Pages] = []

    def pages() -> Pages:
        if not built:  # the App is the project's, built from the settings on first use
            access = Access(
                authorize=lambda request: request.scope.get(_USER) or False, actions=actions
            )
            # One key for every process of the project (a form may post to another worker);
            # actions run in the request's thread, on its Django connection.
            secret = salted_hmac("duejobs.dashboard", "csrf", algorithm="sha256").digest()
            offload = _in_request_thread
            built.append(Pages(get_app(), access, refresh, secret=secret, offload=offload))
        return built[0]

    def view(page: str, tail: Callable[..., str]) -> Callable[..., HttpResponse]:
        def handle(request: HttpRequest, **params: str) -> HttpResponse:
            user = getattr(request, "user", None)
            if user is None or not user.is_authenticated:
                return redirect_to_login(request.get_full_path(), _login_url())
            if not allow(user):  # signed in: another sign-in page would only loop
                return HttpResponseForbidden("this account may not use the jobs dashboard")
            board = pages()
            method = getattr(board, page)
            if page == "recurring" and request.method == "POST":
                method = board.act_recurring
            answer = method(_request(request, tail(**params), params, user.get_username()))
            if inspect.isawaitable(answer):
                answer = async_to_sync(_awaited)(answer)
            return _response(answer)

        exempt: Callable[..., HttpResponse] = csrf_exempt(handle)
        return exempt

    return [
        path("", view("overview", lambda: "")),
        path("schedules", view("schedules", lambda: "schedules")),
        path(
            "schedules/<str:schedule_id>",
            view("schedule", lambda schedule_id: f"schedules/{schedule_id}"),
        ),
        path(
            "schedules/<str:schedule_id>/<str:action>",
            view("act", lambda schedule_id, action: f"schedules/{schedule_id}/{action}"),
        ),
        path("recurring", view("recurring", lambda: "recurring")),
        path("dashboard.css", view("stylesheet", lambda: "dashboard.css")),
    ]


async def _in_request_thread(func: Callable[..., Any], *args: Any) -> Any:
    return await sync_to_async(func, thread_sensitive=True)(*args)


async def _awaited(answer: Any) -> Response:
    return await answer  # type: ignore[no-any-return]


def _request(request: HttpRequest, tail: str, params: dict[str, str], user: str) -> Request:
    """The Starlette request a page reads: this one's method, headers, query and body, under
    the root the URLs were included at (so the pages' links stay inside it)."""
    full = request.path
    root = full[: len(full) - len(tail)].rstrip("/") if tail else full.rstrip("/")
    body = request.body

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": body, "more_body": False}

    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": request.method,
        "scheme": request.scheme,
        "server": (request.META.get("SERVER_NAME", ""), int(request.get_port())),
        "path": full,
        "raw_path": full.encode(),
        "root_path": root,
        "query_string": request.META.get("QUERY_STRING", "").encode("latin-1"),
        # Host as Django reads it (a proxy's X-Forwarded-Host when the settings trust it), so
        # the pages' same-origin check compares what the browser saw.
        "headers": [
            (name.lower().encode("latin-1"), value.encode("latin-1"))
            for name, value in request.headers.items()
            if name.lower() != "host"
        ]
        + [(b"host", request.get_host().encode("latin-1"))],
        "path_params": params,
        _USER: user,
        # The forms' tokens are bound to Django's session: a sign-in or sign-out renews it.
        SESSION_SCOPE: getattr(getattr(request, "session", None), "session_key", None),
    }
    return Request(scope, receive)


def _response(answer: Response) -> HttpResponse:
    response = HttpResponse(answer.body, status=answer.status_code)
    for name, value in answer.headers.items():
        if name.lower() != "content-length":
            response[name] = value
    return response


def _login_url() -> str:
    """Where to sign in: ``settings.LOGIN_URL`` where the project routes it, else the admin's
    sign-in page where the admin is routed (a new project routes the admin, not Django's
    default ``/accounts/login/``), else ``LOGIN_URL`` as it is."""
    from django.conf import settings
    from django.shortcuts import resolve_url
    from django.urls import NoReverseMatch, Resolver404, resolve, reverse

    url = str(resolve_url(settings.LOGIN_URL))
    try:
        resolve(url.split("?", 1)[0])
    except Resolver404:
        try:
            return str(reverse("admin:login"))
        except NoReverseMatch:
            return url
    return url
