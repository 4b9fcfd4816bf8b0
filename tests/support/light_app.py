"""An App as light as a user's may be — one handler, nothing imported but duejobs — for
what a worker loads before its first job (``--app tests.support.light_app:app``)."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import duejobs

# The libraries a worker needs only for a handler's own transaction, the App's reads or a
# migration: loaded by the time its first job runs, they cost its start-up a tenth of a second.
HEAVY = ("sqlalchemy", "alembic")


def loaded(ctx: duejobs.Context, payload: Any) -> None:
    """Write which of :data:`HEAVY` this process has loaded to ``payload["to"]``."""
    found = [name for name in HEAVY if name in sys.modules]
    Path(payload["to"]).write_text(json.dumps(found))


def nap(ctx: duejobs.Context, payload: Any) -> None:
    """Sleeps ``payload["seconds"]``: a slot held, no connection of the handler's own."""
    time.sleep(float(payload["seconds"]))


app = duejobs.App() if os.environ.get("DUEJOBS_DATABASE_URL") else None
if app is not None:
    app.handler("loaded")(loaded)
    app.handler("nap")(nap)
