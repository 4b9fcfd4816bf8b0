"""Configuration mistakes through Sentinel are not outages: a master name no Sentinel knows,
or a Sentinel password that is wrong or missing, ends a service at its start with exit 2 and
one line naming the mistake (no password, no redis-py object). No Sentinel answering is an
outage, waited out; and so is a master the Sentinels stop knowing once a service runs.

Seen failing against the build before: every service waited for good, logging "No master
found" with a list of redis-py clients, and against an outage check that took Sentinel's
MasterNotFoundError for a configuration error. (Each start of a service is a process of its
own: a few seconds each.)
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from duejobs.redis_urls import redis_client, refusal
from duejobs.worker.redis_waits import RedisWaits
from tests.support import wait_for
from tests.support.network import free_ports
from tests.support.processes import ROOT, Proc
from tests.support.sentinel import SERVICE, OneSentinel, one_sentinel
from tests.support.valkey import server_binary

PASSWORD = "s3ntinel-pw"


@pytest.fixture
def sentinel(tmp_path: Path) -> Iterator[OneSentinel]:
    with one_sentinel(server_binary(), tmp_path) as made:
        yield made


@pytest.fixture
def guarded(tmp_path: Path) -> Iterator[OneSentinel]:
    with one_sentinel(server_binary(), tmp_path, password=PASSWORD) as made:
        yield made


def _start(env: dict[str, str], url: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "duejobs", "scheduler"],
        env={**env, "DUEJOBS_REDIS_URL": url, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=60,
    )


def _refused(done: subprocess.CompletedProcess[str], *said: str) -> None:
    assert done.returncode == 2, done.stderr
    for words in said:
        assert words in done.stderr, done.stderr
    for never in (PASSWORD, "wrong-pw", "Redis<", "redis.client", "Traceback"):
        assert never not in done.stderr, done.stderr


def test_a_master_name_no_sentinel_knows_ends_a_service_naming_it(
    env: dict[str, str], sentinel: OneSentinel
) -> None:
    _refused(_start(env, sentinel.url("nosuchmaster")), "no Sentinel knows", "'nosuchmaster'")


def test_a_wrong_sentinel_password_ends_a_service_naming_it(
    env: dict[str, str], guarded: OneSentinel
) -> None:
    url = guarded.url(query="?sentinel_password=wrong-pw")
    _refused(_start(env, url), "refuses duejobs", "sentinel_password")


def test_a_missing_sentinel_password_ends_a_service_naming_it(
    env: dict[str, str], guarded: OneSentinel
) -> None:
    _refused(_start(env, guarded.url()), "refuses duejobs", "sentinel_password")


def test_the_right_sentinel_password_and_master_name_are_not_refused(
    guarded: OneSentinel,
) -> None:
    assert refusal(redis_client(guarded.url(query=f"?sentinel_password={PASSWORD}"))) is None


def test_no_sentinel_answering_is_an_outage_waited_out(env: dict[str, str], tmp_path: Path) -> None:
    (nobody,) = free_ports(1)
    url = f"redis+sentinel://127.0.0.1:{nobody}/{SERVICE}/0"
    proc = Proc(["scheduler"], {**env, "DUEJOBS_REDIS_URL": url}, tmp_path / "scheduler.log")
    try:
        wait_for(lambda: "pass failed" in proc.output(), 60, "the scheduler to meet the outage")
        assert proc.popen.poll() is None, proc.output()
        line = next(line for line in proc.output().splitlines() if "pass failed" in line)
        assert "No master found for 'duejobs'" in line, line
        assert f"connecting to 127.0.0.1:{nobody}" in line, line  # what the Sentinel answered
        assert "redis.client" not in line and "Redis<" not in line, line
    finally:
        assert proc.stop() == 0, proc.output()


def test_a_master_the_sentinels_forget_while_running_is_an_outage(sentinel: OneSentinel) -> None:
    client = redis_client(sentinel.url())
    waits = RedisWaits("the test's Sentinel master")
    assert waits.call("PING", client.ping) is True
    sentinel.client().sentinel_remove(SERVICE)
    client.connection_pool.disconnect()  # the next connection asks the Sentinel again
    gave_up = waits.call("PING", client.ping, give_up=lambda: True)
    assert gave_up is None and waits.out  # waited on (here given up at once), not raised
