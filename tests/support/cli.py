"""The ``duejobs`` command run as a user runs it: a process of its own, its output read."""

from __future__ import annotations

import os
import subprocess
import sys


def run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """``duejobs ARGS`` in the environment ``env`` (this process's when None); two minutes at
    most."""
    return subprocess.run(
        [sys.executable, "-m", "duejobs", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def run_cli(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    """``duejobs ARGS`` with the tests' environment plus ``env``."""
    return run(*args, env={**os.environ, **env})
