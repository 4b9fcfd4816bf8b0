"""Who may use the dashboard, and the proofs its forms carry.

What it promises:

* **No authentication, this machine only.** A dashboard without credentials or a host check
  answers only requests made on its own machine: a client address that is not loopback, or
  any header a proxy adds (``Forwarded``, ``X-Forwarded-*``, ``X-Real-IP``), gets a page
  saying why and nothing else. Behind a reverse proxy on the same host every request comes
  from 127.0.0.1, so the headers are what tell.
* **Forms are bound to the caller, the browser session and a lifetime.** A CSRF token is an
  HMAC of the caller's name, the session (the dashboard's own cookie, or the host
  framework's session: Django's, which a sign-in or sign-out renews) and the time it was
  issued; it is refused after ``Access.form_lifetime`` seconds, in another session or for
  another caller. The message shown after an action is signed for the page it names.
* **Failed sign-ins are throttled**: after ``Access.sign_in_limit`` wrong basic-auth
  passwords from one client address within ``SIGN_IN_WINDOW`` seconds, that address is
  answered 429 until the window has passed, right password or not — and, behind a proxy it
  was not told of (requests forwarded from an address their X-Forwarded-For does not name),
  the 429 and one log line say which proxy and how to tell its clients apart.

What it does not do: decide who a proxy's client is. Behind a proxy, set credentials; the
server's own proxy handling (``duejobs dashboard --proxy``) decides which addresses' headers
are believed.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import inspect
import ipaddress
import json
import logging
import secrets
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from starlette.requests import Request

from duejobs.errors import ConfigurationError

log = logging.getLogger("duejobs.dashboard")

# Headers a proxy adds: a request carrying one did not come straight from this machine.
# The headers of every answer. No script runs on the pages; frames, plugins and foreign
# resources are refused outright.
PAGE_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'none'; style-src 'self'; img-src 'self'; form-action 'self'; "
        "frame-ancestors 'none'; base-uri 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",
    # Payloads, keys and errors: kept out of the browser's and any proxy's cache.
    "Cache-Control": "no-store",
}
PROXY_HEADERS = (
    "Forwarded",
    "X-Forwarded-For",
    "X-Forwarded-Host",
    "X-Forwarded-Proto",
    "X-Real-IP",
)
SESSION_COOKIE = "duejobs_session"
# Where a host framework puts its own session's key in the request's scope (Django's views).
SESSION_SCOPE = "duejobs.session"
SIGN_IN_WINDOW = 300.0
_TRACKED_CLIENTS = 10_000  # failed sign-ins are remembered for this many addresses at most


@dataclass(frozen=True)
class Access:
    """Who may use the dashboard. ``user``/``password``: HTTP basic auth for every page
    (both non-empty); ``authorize``: the host application's own check, a plain function given
    each request, answering the caller's name (its own CSRF token), True (allowed, one token
    for all), or anything else to refuse; ``actions``: cancel, reschedule, retry, run now,
    pause and resume are offered (to an authenticated caller only). ``public_url``: the
    address the browser sees behind a proxy (``https://ops.example.com/duejobs``), whose origin
    a form may come from. ``form_lifetime``: seconds a form's token stays valid.
    ``sign_in_limit``: wrong passwords one address may send within ``SIGN_IN_WINDOW``."""

    user: str | None = None
    password: str | None = field(default=None, repr=False)
    authorize: Callable[[Request], bool | str] | None = None
    actions: bool = False
    public_url: str | None = None
    form_lifetime: float = 4 * 3600.0
    sign_in_limit: int = 5

    def __post_init__(self) -> None:
        if self.authorize is not None and inspect.iscoroutinefunction(self.authorize):
            raise TypeError("Access.authorize must be a plain function (it runs in a thread)")
        if self.public_url is not None:
            public_origin(self.public_url)  # refused here, not at the first form
        if self.form_lifetime <= 0 or self.sign_in_limit < 1:
            raise ConfigurationError("Access.form_lifetime and sign_in_limit must be positive")

    @property
    def authenticates(self) -> bool:
        return self.authorize is not None or (bool(self.user) and bool(self.password))


def public_origin(url: str) -> tuple[str, str, str]:
    """``url``'s origin, host name and path, or a ConfigurationError naming what is wrong."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ConfigurationError(
            f"the public URL must be an absolute http(s) URL such as "
            f"https://ops.example.com/duejobs, not {url!r}"
        )
    if parts.query or parts.fragment:
        raise ConfigurationError(f"the public URL takes no query or fragment: {url!r}")
    return f"{parts.scheme}://{parts.netloc}", parts.hostname, parts.path.rstrip("/")


def is_loopback(host: str) -> bool:
    """Whether ``host`` (an address or ``localhost``) is only reachable from this machine."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def not_local(request: Request) -> str | None:
    """Why ``request`` did not come straight from this machine to one of its loopback names,
    or None if it did. The name matters too: a web page whose own name the attacker points at
    127.0.0.1 (DNS rebinding) reaches a loopback dashboard from the victim's browser, under
    that page's name."""
    for header in PROXY_HEADERS:
        if header in request.headers:
            return f"it came through a proxy (it carries {header})"
    client = request.client.host if request.client else "an unknown address"
    if not is_loopback(client):
        return f"it came from another machine ({client})"
    asked = request.url.hostname or ""
    if not is_loopback(asked.strip("[]")):
        return f"it asked for it by the name {asked!r}, not a loopback name such as 127.0.0.1"
    return None


def basic_user(request: Request) -> tuple[str, str] | None:
    """The user and password of a basic-auth header, or None."""
    scheme, _, encoded = request.headers.get("authorization", "").partition(" ")
    if scheme.lower() != "basic":
        return None
    try:
        user, sep, password = base64.b64decode(encoded, validate=True).decode().partition(":")
    except (binascii.Error, UnicodeDecodeError):
        return None
    return (user, password) if sep else None


class SignIns:
    """Failed sign-ins per client address over the last ``SIGN_IN_WINDOW`` seconds."""

    def __init__(self, limit: int, clock: Callable[[], float] = time.monotonic) -> None:
        self._limit, self._clock = limit, clock
        self._failures: OrderedDict[str, list[float]] = OrderedDict()
        self._lock = threading.Lock()
        self._proxy_said = False  # an unknown proxy's forwarded requests: logged once

    def wait(self, client: str) -> float:
        """Seconds ``client`` must wait before it may try again (0: it may)."""
        client = _network(client)
        with self._lock:
            recent = self._recent(client)
            if len(recent) < self._limit:
                return 0.0
            return max(recent[0] + SIGN_IN_WINDOW - self._clock(), 1.0)

    def failed(self, client: str) -> None:
        client = _network(client)
        with self._lock:
            self._failures[client] = [*self._recent(client), self._clock()]
            self._failures.move_to_end(client)
            while len(self._failures) > _TRACKED_CLIENTS:
                self._failures.popitem(last=False)

    def unknown_proxy(self, forwarded: str, client: str) -> str:
        """What to say of a request forwarded (``forwarded``: its X-Forwarded-For) by a proxy
        this dashboard was not told of — the header does not name the address it came from:
        every client then counts as the proxy's address, so one guesser locks every operator
        out. Logged once, at the first such request."""
        if client in {address.strip() for address in forwarded.split(",")}:
            return ""
        said = (
            f"; every request comes through a proxy at {client} (X-Forwarded-For) that this "
            "dashboard was not told of, so its clients count as one: start it with "
            f"--proxy {client} (mounted in an app: the server's forwarded-address setting)"
        )
        if not self._proxy_said:
            self._proxy_said = True
            log.warning("dashboard: failed sign-ins counted by address%s", said)
        return said

    def _recent(self, client: str) -> list[float]:
        since = self._clock() - SIGN_IN_WINDOW
        return [at for at in self._failures.get(client, []) if at > since]


def _network(client: str) -> str:
    """Whom failed sign-ins are counted for: an IPv4 address, or an IPv6 address's /64 (one
    holder has the whole of it)."""
    try:
        address = ipaddress.ip_address(client)
    except ValueError:
        return client
    if address.version == 6:
        return str(ipaddress.ip_network(f"{address}/64", strict=False))
    return client


class Tokens:
    """The HMACs the pages hand out: CSRF tokens and the messages after actions."""

    def __init__(self, secret: bytes, lifetime: float) -> None:
        self.secret, self._lifetime = secret, lifetime

    def sign(self, text: str) -> str:
        return hmac.new(self.secret, text.encode(), hashlib.sha256).hexdigest()

    def csrf(self, caller: str, session: str, now: float | None = None) -> str:
        issued = str(int(time.time() if now is None else now))
        return f"{issued}.{self.sign(_csrf_text(caller, session, issued))}"

    def csrf_refusal(self, token: str, caller: str, session: str) -> str | None:
        """Why ``token`` is not this caller's in this session, or None if it is."""
        issued, _, mac = token.partition(".")
        expected = self.sign(_csrf_text(caller, session, issued))
        if not issued.isdigit() or not hmac.compare_digest(mac.encode(), expected.encode()):
            return "missing or wrong CSRF token"
        if time.time() - int(issued) > self._lifetime:
            return "this form has expired: load the page again"
        return None

    @staticmethod
    def new_session() -> str:
        return secrets.token_urlsafe(24)


def _csrf_text(caller: str, session: str, issued: str) -> str:
    """What a CSRF token signs: its parts as a JSON list, so that no two differ only in
    where one part ends (a caller's name may hold any character)."""
    return json.dumps(["csrf", caller, session, issued])
