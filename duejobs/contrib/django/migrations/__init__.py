"""duejobs' tables made and upgraded by ``manage.py migrate``: each migration here runs duejobs'
own (Alembic, as ``duejobs migrate``) to the newest revision on the database duejobs uses. A
duejobs release that adds a revision adds a migration here that runs them again; at the newest
revision they do nothing. Reversing one leaves the tables (``duejobs`` owns them, not Django)."""

from __future__ import annotations

from typing import Any


def upgrade(apps: Any, schema_editor: Any) -> None:
    """duejobs' revisions to the newest, on the database duejobs uses only."""
    from duejobs.contrib.django import get_app, settings_urls

    _, _, alias = settings_urls()
    if schema_editor.connection.alias == alias:  # not on the project's other databases
        get_app().migrate()
