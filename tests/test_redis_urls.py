"""Redis in every form teams deploy: a server's own address, Sentinel's URL
(``redis+sentinel://``, ``sentinel://``) in ``DUEJOBS_REDIS_URL``, ``DUEJOBS_REDIS_NODES``
and the App, and a ready client given to the App; passwords (the master's and Sentinel's)
never shown. Seen failing against the build before: every Sentinel form refused as "not a
Redis URL", and the App taking no client."""

from __future__ import annotations

import pytest
import redis

from duejobs import App
from duejobs.config import parse_redis_nodes, redacted
from duejobs.errors import ConfigurationError
from duejobs.redis_urls import check_redis_url, same_redis, sentinel_url
from duejobs.scheduler.loop import Scheduler
from duejobs.worker import Runtime, Worker
from tests.support.apps import register

SENTINEL = "redis+sentinel://:m4ster@s1:26379,s2:26380/mymaster/2?sentinel_password=s3ntinel"


def test_a_sentinel_url_names_its_sentinels_its_master_and_its_database() -> None:
    read = sentinel_url(SENTINEL)
    assert read is not None
    assert read.sentinels == (("s1", 26379), ("s2", 26380))
    assert (read.service, read.db, read.password, read.sentinel_password) == (
        "mymaster",
        2,
        "m4ster",
        "s3ntinel",
    )


@pytest.mark.parametrize("scheme", ["redis+sentinel", "sentinel", "rediss+sentinel"])
def test_every_sentinel_scheme_is_read_and_the_default_port_and_database_apply(
    scheme: str,
) -> None:
    read = sentinel_url(f"{scheme}://s1,s2/mymaster")
    assert read is not None
    assert (read.sentinels, read.db, read.ssl) == (
        (("s1", 26379), ("s2", 26379)),
        0,
        scheme == "rediss+sentinel",
    )


def test_a_password_with_a_slash_or_a_question_mark_is_never_shown() -> None:
    """Read as URLs are parsed, an unencoded ``/`` ends the host: the password's tail was
    shown as the path. Seen failing with the URL parser's reading."""
    for url in ("redis://:pa/ss@h:6379/0", "redis://u:p?ss@h/0", "redis+sentinel://:p#s@s1/m"):
        shown = redacted(url)
        assert "pa/ss" not in shown and "p?ss" not in shown and "p#s" not in shown, shown


def test_a_sentinel_url_never_shows_either_password() -> None:
    shown = redacted(SENTINEL)
    assert "m4ster" not in shown and "s3ntinel" not in shown
    assert shown.startswith("redis+sentinel://:***@s1:26379,s2:26380/mymaster/2")
    assert "m4ster" not in repr(sentinel_url(SENTINEL))


@pytest.mark.parametrize(
    ("url", "named"),
    [
        ("redis+sentinel://:m4ster@s1:port/mymaster", "bad Sentinel"),
        ("redis+sentinel://:m4ster@s1:26379", "names the master"),
        ("redis+sentinel://:m4ster@s1:26379/mymaster/zero", "names the master"),
    ],
)
def test_a_malformed_sentinel_url_is_refused_naming_the_problem_not_the_password(
    url: str, named: str
) -> None:
    with pytest.raises(ConfigurationError, match=named) as refused:
        check_redis_url(url)
    assert "m4ster" not in str(refused.value)


def test_two_spellings_of_one_sentinel_master_are_one_node() -> None:
    assert same_redis("sentinel://s2:26380,s1/mymaster") == same_redis(
        "redis+sentinel://s1:26379,s2:26380/mymaster/0"
    )
    assert same_redis("sentinel://s1/mymaster/0") != same_redis("sentinel://s1/mymaster/1")


def test_redis_nodes_take_sentinel_urls_whose_commas_list_sentinels() -> None:
    spec = f"reports={SENTINEL}, emails=redis://r3:6379/0"
    assert parse_redis_nodes(spec) == (("reports", SENTINEL), ("emails", "redis://r3:6379/0"))


def test_the_app_takes_a_sentinel_url(database_url: str) -> None:
    app = App(database_url, SENTINEL)
    try:
        assert app.settings.redis_url == SENTINEL
    finally:
        app.close()


@pytest.mark.usefixtures("app")  # on empty tables: its pass pushes this test's row alone
def test_an_app_given_a_ready_client_schedules_delivers_and_works_through_it(
    database_url: str, redis_url: str, redis_client: redis.Redis
) -> None:
    """``App(redis=client)``: the scheduler's pushes and the worker's takes go through the
    client given (a Sentinel's ``master_for()`` is one), no URL needed."""
    given = redis.Redis.from_url(redis_url)
    app = register(App(database_url, redis=given))
    try:
        assert app.settings.redis_url is None and app.settings.has_redis
        s = app.schedule("record", {}, delay=0)
        assert Scheduler(app).run_once().queued == 1
        assert app.core.deliverer().redis is given
        runtime = Runtime(app)
        try:
            worker = Worker(runtime)
            assert worker.wire.redis is given
            worker.work(burst=True)
        finally:
            runtime.close()
        assert app.get(s.id).status.value == "succeeded"  # type: ignore[union-attr]
    finally:
        app.close()


def test_a_client_and_a_url_together_or_a_client_that_is_not_one_are_refused(
    database_url: str, redis_url: str
) -> None:
    with pytest.raises(ConfigurationError, match="not both"):
        App(database_url, redis_url, redis=redis.Redis.from_url(redis_url))
    with pytest.raises(ConfigurationError, match=r"must be a redis\.Redis client"):
        App(database_url, redis=redis_url)  # type: ignore[arg-type]
