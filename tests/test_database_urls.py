"""Database URLs in every form libpq reads — several hosts with ``target_session_attrs``, a
``key=value`` string, a service file — reach the server, and no form lets a password into a
message."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from urllib.parse import quote

import pytest
from psycopg.conninfo import conninfo_to_dict

from duejobs import App
from duejobs.config import libpq_url, redacted
from duejobs.errors import ConfigurationError, DatabaseUnavailableError

# A port nothing listens on: libpq moves on to the next host at once.
DEAD = ("127.0.0.1", "1")


def _parts(database_url: str) -> dict[str, str]:
    parts = {k: str(v) for k, v in conninfo_to_dict(libpq_url(database_url)).items()}
    parts.setdefault("port", "5432")
    return parts


def _works(url: str) -> None:
    app = App(url)
    try:
        s = app.schedule("remind", {}, delay=timedelta(hours=1))
        assert app.get(s.id) is not None
    finally:
        app.close()


def test_a_url_with_several_hosts_reaches_the_one_that_answers(database_url: str, app: App) -> None:
    p = _parts(database_url)
    hosts = f"{DEAD[0]}:{DEAD[1]},{quote(p['host'], safe='')}:{p['port']}"
    user = quote(p["user"]) + (f":{quote(p['password'])}" if p.get("password") else "")
    _works(f"postgresql://{user}@{hosts}/{p['dbname']}?target_session_attrs=read-write")


def test_a_key_value_connection_string_is_a_database_url(database_url: str, app: App) -> None:
    p = _parts(database_url)
    fields = {**p, "host": f"{DEAD[0]},{p['host']}", "port": f"{DEAD[1]},{p['port']}"}
    _works(" ".join(f"{k}='{v}'" for k, v in fields.items()))


def test_a_service_names_the_server(
    database_url: str, app: App, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    services = tmp_path / "pg_service.conf"
    lines = "".join(f"{k}={v}\n" for k, v in _parts(database_url).items())
    services.write_text(f"[duejobs_tests]\n{lines}")
    monkeypatch.setenv("PGSERVICEFILE", str(services))
    _works("postgresql:///?service=duejobs_tests")


def test_no_password_of_a_url_with_several_hosts_reaches_a_message() -> None:
    url = "postgresql://app:hunter2@127.0.0.1:1,127.0.0.1:2/app?connect_timeout=2"
    assert "hunter2" not in redacted(url)
    app = App(url)
    try:
        with pytest.raises(DatabaseUnavailableError) as info:
            app.schedule("remind", {}, delay=timedelta(hours=1))
        assert "hunter2" not in str(info.value)
    finally:
        app.close()


def test_no_password_of_a_key_value_string_reaches_a_message() -> None:
    assert "hunter2" not in redacted("host=db user=app password=hunter2 dbname=app")


@pytest.mark.parametrize(
    "url",
    ["postgresql://app@h1:5432,h2:port/app", "postgresql://app@h1:x/app", "host=db port=x"],
)
def test_a_port_that_is_not_a_number_is_refused(url: str) -> None:
    with pytest.raises(ConfigurationError, match="not a database URL"):
        App(url)
