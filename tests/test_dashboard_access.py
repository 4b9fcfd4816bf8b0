"""What the dashboard's forms and sign-ins prove (``duejobs.dashboard.access``): a form's
token is bound to its caller, its browser session and a lifetime; an action's message shows
on its own page only; wrong passwords are throttled; nothing a page shows is cached.

Seen failing on the tokens bound to the caller alone: the session, lifetime and message
tests; on pages without ``Cache-Control`` and sign-ins without a limit: the other two.
"""

from __future__ import annotations

import time
from urllib.parse import urlsplit

import pytest
from starlette.testclient import TestClient

from duejobs import App, Status
from duejobs.dashboard import Access, create_dashboard
from duejobs.dashboard.access import SESSION_COOKIE, Tokens
from tests.support.dashboard import HERE, LOCAL, auth, csrf

ACCESS = Access(user="ops", password="s3cret", actions=True)
SECRET = b"k" * 32


def test_pages_are_kept_out_of_every_cache(app: App) -> None:
    s = app.schedule("record", {"card": "4111"}, delay=60)
    with TestClient(create_dashboard(app, ACCESS), headers=auth()) as client:
        for path in ("/", "/schedules", f"/schedules/{s.id}", "/recurring"):
            assert client.get(path).headers["cache-control"] == "no-store", path
        assert client.get("/", headers=auth(password="no")).headers["cache-control"] == "no-store"
    with TestClient(create_dashboard(app), client=("203.0.113.9", 1)) as other:
        assert other.get("/").headers["cache-control"] == "no-store"


def test_wrong_passwords_from_one_address_are_throttled(app: App) -> None:
    board = create_dashboard(app, Access(user="ops", password="s3cret", sign_in_limit=3))
    with TestClient(board, client=("198.51.100.7", 1)) as guesser:
        for _ in range(3):
            assert guesser.get("/", headers=auth(password="guess")).status_code == 401
        blocked = guesser.get("/", headers=auth())
        assert blocked.status_code == 429 and int(blocked.headers["retry-after"]) > 0
    with TestClient(board, client=("198.51.100.8", 1)) as colleague:
        assert colleague.get("/", headers=auth()).status_code == 200
    for n in range(1, 5):  # one holder of an IPv6 /64 is one address
        with TestClient(board, client=(f"2001:db8::{n}", 1)) as rotating:
            rotating.get("/", headers=auth(password="guess"))
    with TestClient(board, client=("2001:db8::99", 1)) as same_network:
        assert same_network.get("/", headers=auth()).status_code == 429


def test_a_sign_in_limit_behind_a_proxy_it_was_not_told_of_says_how_to_tell_it(
    app: App, caplog: pytest.LogCaptureFixture
) -> None:
    """Behind nginx without ``--proxy`` every request comes from the proxy's address, so one
    guesser uses up the sign-ins of every operator: the 429 says that the requests come
    through a proxy, which one, and that ``--proxy`` tells clients apart, and the log says it
    once at the first forwarded request. Seen failing with a bare "too many failed sign-ins"
    for everyone, nothing said of the proxy."""
    board = create_dashboard(app, Access(user="ops", password="s3cret", sign_in_limit=2))
    forwarded = {"X-Forwarded-For": "198.51.100.20"}
    with TestClient(board, client=("127.0.0.1", 1)) as through_nginx:
        for _ in range(2):
            through_nginx.get("/", headers={**auth(password="guess"), **forwarded})
        blocked = through_nginx.get("/", headers={**auth(), **forwarded})
    assert blocked.status_code == 429
    assert "127.0.0.1" in blocked.text and "--proxy 127.0.0.1" in blocked.text, blocked.text
    said = [r for r in caplog.records if "--proxy" in r.getMessage()]
    assert len(said) == 1, [r.getMessage() for r in caplog.records]


def test_a_form_is_bound_to_the_browser_session_it_was_shown_in(app: App) -> None:
    s = app.schedule("record", {}, delay=60)
    board = create_dashboard(app, ACCESS)
    with (
        TestClient(board, headers=auth()) as mine,
        TestClient(board, headers=auth()) as other,
    ):
        token = csrf(mine.get(f"/schedules/{s.id}").text)
        assert SESSION_COOKIE in mine.cookies
        other.get("/")  # a session of its own
        stolen = other.post(f"/schedules/{s.id}/cancel", data={"csrf": token})
        assert stolen.status_code == 403 and "CSRF" in stolen.text
        assert app.get(s.id).status is Status.SCHEDULED  # type: ignore[union-attr]
        assert "cancel: done" in mine.post(f"/schedules/{s.id}/cancel", data={"csrf": token}).text


def test_a_form_expires_after_its_lifetime(app: App) -> None:
    s = app.schedule("record", {}, delay=60)
    lifetime = 600.0
    access = Access(user="ops", password="s3cret", actions=True, form_lifetime=lifetime)
    with TestClient(create_dashboard(app, access, secret=SECRET), headers=auth()) as client:
        client.get(f"/schedules/{s.id}")
        session = client.cookies[SESSION_COOKIE]
        old = Tokens(SECRET, lifetime).csrf("ops", session, now=time.time() - lifetime - 1)
        refused = client.post(f"/schedules/{s.id}/cancel", data={"csrf": old})
        assert refused.status_code == 403 and "expired" in refused.text
        fresh = Tokens(SECRET, lifetime).csrf("ops", session, now=time.time() - lifetime + 60)
        assert "cancel: done" in client.post(f"/schedules/{s.id}/cancel", data={"csrf": fresh}).text


def test_an_actions_message_shows_on_its_own_page_only(app: App) -> None:
    first = app.schedule("record", {}, delay=60)
    second = app.schedule("record", {}, delay=60)
    board = create_dashboard(app, ACCESS)
    with TestClient(board, headers=auth(), client=LOCAL, base_url=HERE) as client:
        token = csrf(client.get(f"/schedules/{first.id}").text)
        done = client.post(
            f"/schedules/{first.id}/cancel", data={"csrf": token}, follow_redirects=False
        )
        message = urlsplit(done.headers["location"]).query
        assert 'id="done"' in client.get(f"/schedules/{first.id}?{message}").text
        assert 'id="done"' not in client.get(f"/schedules/{second.id}?{message}").text
        swapped = message.replace("done=", "failed=")  # the same text, said as a failure
        assert 'id="failed"' not in client.get(f"/schedules/{first.id}?{swapped}").text


def test_odd_page_numbers_and_event_ids_are_ignored_not_errors(app: App) -> None:
    s = app.schedule("record", {}, delay=60)
    with TestClient(create_dashboard(app, ACCESS), headers=auth()) as client:
        for odd in ("²", "9" * 40, "-1", "1e3"):
            assert client.get("/", params={"page": odd}).status_code == 200, odd
            assert client.get(f"/schedules/{s.id}", params={"before": odd}).status_code == 200
