"""The ``duejobs`` command run as a user runs it: a process of its own, its output read."""

from __future__ import annotations

import os
import subprocess
import sys


def run_cli(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    """``duejobs ARGS`` with the tests' environment plus ``env``; two minutes at most."""
    return subprocess.run(
        [sys.executable, "-m", "duejobs", *args],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=120,
    )
