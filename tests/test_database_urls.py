"""Database URLs in every form libpq reads — several hosts with ``target_session_attrs``, a
``key=value`` string, a service file — reach the server, and no form lets a password into a
message."""

from __future__ import annotations

import uuid
from datetime import timedelta
from pathlib import Path
from urllib.parse import quote, unquote

import pytest
from psycopg.conninfo import conninfo_to_dict
from sqlalchemy import make_url

from duejobs import App
from duejobs.config import libpq_url, redacted
from duejobs.core import make_engine
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
    attributes = "target_session_attrs=read-write&load_balance_hosts=random"
    _works(f"postgresql://{user}@{hosts}/{p['dbname']}?{attributes}")


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


def test_a_server_whose_host_is_gone_is_noticed_within_half_a_minute(
    database_url: str, app: App
) -> None:
    # TCP keepalives and a user timeout on every connection, unless the URL says otherwise
    def parameters(url: str) -> dict[str, str]:
        engine = make_engine(url)
        try:
            with engine.connect() as conn:
                return dict(conn.connection.driver_connection.info.get_parameters())  # type: ignore[union-attr]
        finally:
            engine.dispose()

    given = parameters(database_url)
    assert (given["keepalives_idle"], given["tcp_user_timeout"]) == ("10", "30000")
    own = make_url(database_url).update_query_dict({"tcp_user_timeout": "5000"})
    assert parameters(own.render_as_string(hide_password=False))["tcp_user_timeout"] == "5000"


@pytest.mark.parametrize(
    ("url", "reads"),
    [
        ("postgres://u:pw@[::1]:5432,[::2]:5433/db", {"host": "::1,::2", "port": "5432,5433"}),
        ("postgresql://:pw@h1:1,h2:2/db", {"password": "pw", "host": "h1,h2"}),
        ("host=h user=app@srv password=p@ss dbname=db", {"user": "app@srv", "password": "p@ss"}),
    ],
)
def test_libpq_reads_each_form_as_duejobs_passes_it_on(url: str, reads: dict[str, str]) -> None:
    parts = conninfo_to_dict(libpq_url(url))
    assert {k: parts.get(k) for k in reads} == reads


# Passwords SQLAlchemy and libpq read differently when written raw: libpq ends the user part
# at the first "/" (a "123/x" password becomes a host and a port), SQLAlchemy decodes "%20"
# before it hands the URL on (libpq then refuses the raw space, quoting the password).
@pytest.mark.parametrize(
    ("password", "several_hosts"),
    [("123/x", False), ("a%20b", True)],
    ids=["slash-in-password", "space-in-password-several-hosts"],
)
def test_a_workers_own_connections_reach_the_engines_server_whatever_the_urls_form(
    database_url: str, app: App, password: str, several_hosts: bool
) -> None:
    """A worker's claims and outcomes run on connections it makes itself
    (``Core.connect_directly``); they must reach the server, database and user the App's
    engine reaches. Seen failing on the code that took such URLs as given: libpq read the first
    with another user (or the user as the host), and refused the second quoting the password."""
    p = _parts(database_url)
    role = f"duejobs_url_{uuid.uuid4().hex[:12]}"  # of this test alone, dropped after it
    with app.core.transaction() as conn:
        conn.exec_driver_sql(
            f"CREATE ROLE {role} LOGIN PASSWORD '{unquote(password)}'"  # a constant
        )
    if several_hosts:
        where = f"{DEAD[0]}:{DEAD[1]},{quote(p['host'], safe='')}:{p['port']}/{p['dbname']}"
    else:  # the host in the query: it may be a socket's directory
        where = f"/{p['dbname']}?host={quote(p['host'], safe='/')}&port={p['port']}"
    other = App(f"postgresql://{role}:{password}@{where}")
    server = "SELECT current_user, current_database(), inet_server_port()"
    try:
        with other.core.engine.connect() as conn:
            engines = conn.exec_driver_sql(server).one()
        direct = other.core.connect_directly()
        try:
            own = direct.connection.driver_connection.execute(server).fetchone()  # type: ignore[union-attr]
        finally:
            direct.close()
    finally:
        other.close()
        with app.core.transaction() as conn:
            conn.exec_driver_sql(f"DROP ROLE {role}")
    assert tuple(own) == tuple(engines) == (role, p["dbname"], engines[2])


def test_no_password_reaches_the_repr_of_an_apps_settings_or_core() -> None:
    """A repr lands in debuggers, error reports and logs (``%r``): the database's, the
    replica's, Redis', a node's and Sentinel's passwords stay out of it."""
    app = App(
        "postgresql://app:db-s3cret@127.0.0.1:1/app",
        "redis+sentinel://:redis-s3cret@127.0.0.1:1/mymaster/0?sentinel_password=sentinel-s3cret",
        read_database_url="postgresql://ro:replica-s3cret@127.0.0.1:1/app",
        redis_nodes={"reports": "redis://:node-s3cret@127.0.0.1:1/0"},
    )
    try:
        shown = repr(app.settings) + repr(app.core) + str(app.settings)
        for secret in ("db-s3cret", "redis-s3cret", "sentinel-s3cret", "replica-s3cret"):
            assert secret not in shown, shown
        assert "node-s3cret" not in shown, shown
        assert "127.0.0.1" in repr(app.settings)  # still says where it points
    finally:
        app.close()
    in_query = App("postgresql://app@127.0.0.1:1/app?password=query-s3cret")
    try:
        assert in_query.core.engine is not None  # made: its repr would show the query
        assert "query-s3cret" not in repr(in_query.core) + repr(in_query.settings)
    finally:
        in_query.close()


@pytest.mark.parametrize(
    "url",
    [
        "postgresql://app@127.0.0.1:1/app?foo=bar",
        "postgresql://app@127.0.0.1:1,127.0.0.1:2/app?sslmode=prefer&tyop=1",
    ],
)
def test_a_parameter_libpq_does_not_know_is_refused_as_the_app_is_made(url: str) -> None:
    """Refused naming it, at once, not at the first query with a 153-line traceback."""
    with pytest.raises(ConfigurationError, match=r"libpq does not know: (foo|tyop)"):
        App(url)


@pytest.mark.parametrize(
    "url",
    [
        "postgresql://u@h/db?password=s3c%2Fr3t!x~y&sslmode=require",
        "postgresql://u@h/db?sslpassword=s3c.r3t-x~y%40z",
        "redis://h:6379/0?password=s3c%2Fr3t!x~y",
        "redis+sentinel://s1:26379/mymaster/0?sentinel_password=s3c.r3t-x%2By",
    ],
)
def test_a_punctuated_or_percent_encoded_secret_in_a_query_is_redacted_whole(url: str) -> None:
    """No piece of the secret after its first punctuation survives (a redaction that stopped
    at the first non-word character left ``r3t!x~y`` in the message)."""
    shown = redacted(url)
    for piece in ("s3c", "r3t", "x~y", "%40z", "%2By"):
        assert piece not in shown, shown
