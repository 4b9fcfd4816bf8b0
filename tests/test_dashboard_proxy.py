"""The dashboard where production puts it: behind a reverse proxy (``tests/proxy.py``, a real
proxy process doing what an nginx ``location`` block does, in front of a real ``duejobs
dashboard``), and on the open network (a mounted dashboard seen by a client of another
machine).

Seen failing on the dashboard that trusted the address it bound to: every test but the last
(the proxied overview answered 200 with every payload; ``--proxy``/``--public-url`` did not
exist; ``--host 127.0.0.2`` answered 400); the rebinding case, on the check of the client's
address and headers alone.
"""

from __future__ import annotations

import re
from collections.abc import Callable

import httpx
import pytest
from starlette.testclient import TestClient

from duejobs import App, Status
from duejobs.dashboard import create_dashboard
from tests.support import wait_for
from tests.support.network import free_port, listening
from tests.support.processes import Proc

PASSWORD = {"DUEJOBS_DASHBOARD_PASSWORD": "s3cret"}
PUBLIC = "ops.example.test"  # the name the browser sees: the proxy's


def _dashboard(spawn: Callable[..., Proc], *args: str, port: int | None = None, **env: str) -> int:
    port = port or free_port()
    spawn("dashboard", "--port", str(port), *args, extra_env=env or None)
    host = args[args.index("--host") + 1] if "--host" in args else "127.0.0.1"
    wait_for(lambda: listening(port, host), 60, "the dashboard to listen")
    return port


def _proxy(
    spawn: Callable[..., Proc], upstream: int, prefix: str = "", *, forward_host: bool = False
) -> int:
    port = free_port()
    argv = [str(port), str(upstream), prefix] + (["--forward-host"] if forward_host else [])
    spawn(code=f"from tests.proxy import main; main({argv!r})")
    wait_for(lambda: listening(port), 30, "the proxy to listen")
    return port


def test_an_unauthenticated_dashboard_refuses_what_came_through_a_proxy(
    app: App, spawn: Callable[..., Proc]
) -> None:
    app.schedule("record", {"card": "4111-secret"}, key="order-7", delay=600)
    port = _dashboard(spawn)
    via = _proxy(spawn, port)
    assert httpx.get(f"http://127.0.0.1:{port}/schedules").status_code == 200
    for path in ("/", "/schedules"):
        answer = httpx.get(f"http://127.0.0.1:{via}{path}")
        assert answer.status_code == 403, answer.text
        assert "came through a proxy" in answer.text and "--user" in answer.text
        assert "order-7" not in answer.text and "4111" not in answer.text


@pytest.mark.parametrize(
    ("client", "headers", "says"),
    [
        (("203.0.113.9", 40000), {}, "from another machine (203.0.113.9)"),
        (("127.0.0.1", 40000), {"X-Forwarded-For": "203.0.113.9"}, "X-Forwarded-For"),
        (("127.0.0.1", 40000), {"Forwarded": "for=203.0.113.9"}, "Forwarded"),
        (("127.0.0.1", 40000), {"X-Real-IP": "203.0.113.9"}, "X-Real-IP"),
        # DNS rebinding: a page whose name now points at 127.0.0.1, read from the browser
        (("127.0.0.1", 40000), {"Host": "attacker.example:8080"}, "by the name"),
    ],
)
def test_a_mounted_dashboard_without_authentication_answers_this_machine_only(
    app: App, client: tuple[str, int], headers: dict[str, str], says: str
) -> None:
    board = create_dashboard(app)
    with TestClient(board, client=client, base_url="http://127.0.0.1") as other:
        answer = other.get("/schedules", headers=headers)
        assert answer.status_code == 403 and says in answer.text, answer.text
    with TestClient(board, client=("127.0.0.1", 40000), base_url="http://127.0.0.1") as local:
        assert local.get("/schedules").status_code == 200
        assert local.get("/schedules", headers={"Host": "[::1]:8080"}).status_code == 200


@pytest.mark.parametrize(
    "forward_host", [True, False], ids=["host-forwarded", "host-not-forwarded"]
)
def test_behind_a_proxy_with_authentication_pages_and_actions_work(
    app: App, spawn: Callable[..., Proc], forward_host: bool
) -> None:
    s = app.schedule("record", {}, delay=600)
    port = free_port()
    via = _proxy(spawn, port, "/duejobs", forward_host=forward_host)
    public = f"http://{PUBLIC}/duejobs"
    args = ["--user", "ops", "--actions", "--proxy", "127.0.0.1", "--public-url", public]
    _dashboard(spawn, *args, port=port, **PASSWORD)
    with httpx.Client(
        base_url=f"http://127.0.0.1:{via}/duejobs",
        auth=("ops", "s3cret"),
        headers={"Host": PUBLIC},
        follow_redirects=True,
    ) as browser:
        page = browser.get(f"/schedules/{s.id}")
        assert page.status_code == 200, page.text
        assert 'href="/duejobs/dashboard.css"' in page.text
        assert browser.get("/dashboard.css").status_code == 200
        token = re.search(r'name="csrf" value="([^"]+)"', page.text)
        assert token is not None
        done = browser.post(
            f"/schedules/{s.id}/cancel",
            data={"csrf": token[1]},
            headers={"Origin": f"http://{PUBLIC}"},
        )
        assert done.status_code == 200 and done.url.path == f"/duejobs/schedules/{s.id}"
        assert "cancel: done" in done.text, done.text
        other = browser.post(
            f"/schedules/{s.id}/retry",
            data={"csrf": token[1]},
            headers={"Origin": "http://elsewhere.example"},
        )
        assert other.status_code == 403
    stored = app.get(s.id)
    assert stored is not None and stored.status is Status.CANCELLED


def test_a_dashboard_on_another_loopback_address_answers_its_own_name(
    app: App, spawn: Callable[..., Proc]
) -> None:
    port = _dashboard(spawn, "--host", "127.0.0.2")
    assert httpx.get(f"http://127.0.0.2:{port}/").status_code == 200
    assert (
        httpx.get(f"http://127.0.0.2:{port}/", headers={"Host": "rebound.example"}).status_code
        == 400
    )


def test_the_public_url_must_be_an_absolute_http_url(
    spawn: Callable[..., Proc],
) -> None:
    proc = spawn(
        "dashboard", "--user", "ops", "--public-url", "ops.example.test", extra_env=PASSWORD
    )
    assert proc.popen.wait(timeout=60) == 2
    assert "--public-url" in proc.output() and "http" in proc.output()


def test_a_public_url_needs_the_proxys_address(spawn: Callable[..., Proc]) -> None:
    """Without ``--proxy`` every request would come from the proxy's address, one sign-in
    limit for all that anyone could use up."""
    proc = spawn(
        "dashboard", "--user", "ops", "--public-url", f"https://{PUBLIC}/x", extra_env=PASSWORD
    )
    assert proc.popen.wait(timeout=60) == 2
    assert "--public-url needs --proxy" in proc.output()
