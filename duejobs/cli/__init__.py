"""The ``duejobs`` command line.

Without ``DUEJOBS_DATABASE_URL`` / ``DUEJOBS_REDIS_URL`` every command uses the embedded
PostgreSQL and Redis kept under ``./.duejobs`` (``--data-dir``), starting them if needed and
saying so in one line. Bad input exits with status 2 and a message naming the problem;
an unreachable service exits with status 1.
"""

from duejobs.cli.group import main

__all__ = ["main"]
