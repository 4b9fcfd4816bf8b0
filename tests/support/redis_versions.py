"""duejobs' Lua scripts as an older Redis runs them, on the Redis under test."""

from __future__ import annotations

import re

# From ``if nil then`` to its ``else``: a branch no Redis runs.
_DEAD_BRANCH = re.compile(r"^( *)if nil then\n.*?^\1else\b", re.S | re.M)


def as_redis_6_2_runs_it(script: str) -> str:
    """``script`` as Redis 6.2 runs it: ``redis.REDIS_VERSION_NUM`` exists from 7.0 on, so a
    branch taken where it does is not taken (runnable as it stands)."""
    return script.replace("redis.REDIS_VERSION_NUM", "nil")


def without_dead_branches(script: str) -> str:
    """``script`` without the branches an ``if nil then`` never takes (for reading it)."""
    return _DEAD_BRANCH.sub("", script)
