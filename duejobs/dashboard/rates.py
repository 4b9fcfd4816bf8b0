"""The rate limits' form of the recurring and quotas page: a queue's or a tenant's limit set
or cleared by an operator (an unscoped dashboard with actions only).

What it promises: a bad rate, scope or name is answered naming it, and nothing is written; a
database out of reach is said as such. What it does not do: read the limits (the page does,
:meth:`duejobs.App.rate_limits`).
"""

from __future__ import annotations

from duejobs import App
from duejobs.errors import DatabaseUnavailableError, DuejobsError


def apply_rate_limit(app: App, scope: str, name: str, rate: str) -> dict[str, str]:
    """Set (``rate`` ``"none"``: clear) the limit of the queue or tenant ``name``; the outcome
    as the page says it (``done`` or ``failed``)."""
    limit = None if rate.strip().lower() == "none" else rate.strip()
    try:
        if scope == "queue":
            app.set_rate_limit(name, limit)
        elif scope == "tenant":
            app.set_quota(name, max_rate=limit)
        else:
            return {"failed": f"a rate limit is a queue's or a tenant's, not {scope!r}'s"}
    except DatabaseUnavailableError:
        return {"failed": "the database is unavailable; nothing was changed"}
    except DuejobsError as exc:
        return {"failed": str(exc)}
    return {"done": f"rate limit of {scope} {name}: {limit or 'none'}"}
