"""The oldest Redis duejobs runs on: 6.2, the version RQ's own worker needs. Every command the
Lua scripts call as Redis 6.2 runs them (a branch taken only where ``redis.REDIS_VERSION_NUM``
exists, 7.0 and later, left out) is asked of the server under test — ``COMMAND DOCS`` gives the
version each came in —, so a script that starts to need a newer Redis fails here rather than
on a team's server; and the worker's take as 6.2 runs it is run by the band tests of
``tests/test_priority.py``. Seen failing with the worker's ``LMPOP`` outside its 7.0 branch.
"""

from __future__ import annotations

import re

import redis

from duejobs.rq_wire import scripts
from tests.support.redis_versions import as_redis_6_2_runs_it, without_dead_branches

OLDEST = (6, 2, 0)
# A quoted word in capitals: a command (``redis.call('HSET', ...)``, ``{'LMPOP', ...}``) or
# an argument (``'COUNT'``); the server tells which (it documents commands only).
_WORD = re.compile(r"'([A-Z]{2,})'")


def _as_6_2_reads_it(script: str) -> str:
    return without_dead_branches(as_redis_6_2_runs_it(script))


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in text.split("."))


def _scripts() -> list[str]:
    found = [value for name, value in vars(scripts).items() if name.endswith("_SCRIPT")]
    return [*found, scripts.TAKE]


def test_every_command_the_scripts_call_came_by_redis_6_2(redis_client: redis.Redis) -> None:
    words = {w for source in _scripts() for w in _WORD.findall(_as_6_2_reads_it(source))}
    docs = redis_client.execute_command("COMMAND DOCS", *sorted(words))
    since = {_text(name): _text(doc[b"since"]) for name, doc in docs.items()}
    assert {"lpop", "hset", "zadd", "rpush", "lrem"} <= set(since)  # the scripts were read
    newer = {name: v for name, v in since.items() if _version(v) > OLDEST}
    assert not newer, f"commands newer than Redis 6.2: {newer}"
    assert "LMPOP" in scripts.TAKE  # Redis 7.0's branch is there, and left out above
