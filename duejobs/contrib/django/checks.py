"""Django system checks for duejobs' settings: ``manage.py check`` names what is wrong.

* ``duejobs.E001``: the settings duejobs reads are wrong — its database is not PostgreSQL
  (judged by the backend's vendor, so PostGIS and wrapped PostgreSQL engines pass), an
  unknown ``DUEJOBS`` key or a value duejobs refuses (named ``DUEJOBS['KEY']``), an alias not
  in ``DATABASES``.
"""

from __future__ import annotations

from typing import Any

from django.apps import apps
from django.core import checks


def register_checks() -> None:
    checks.register(duejobs_settings)


def duejobs_settings(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """What the duejobs application found wrong with the settings at start-up, if anything."""
    error = apps.get_app_config("duejobs").configuration_error
    if error is None:
        return []
    return [
        checks.Error(
            str(error),
            hint="duejobs needs a PostgreSQL database (psycopg 3), the DUEJOBS setting's "
            "known keys and values duejobs accepts; see duejobs.contrib.django.",
            id="duejobs.E001",
        )
    ]
