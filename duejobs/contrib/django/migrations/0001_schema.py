"""duejobs' tables made by ``manage.py migrate``: duejobs' own migrations (Alembic, the same
as ``duejobs migrate``) run to the newest revision on the database duejobs uses. A duejobs
release that adds a revision adds a Django migration that runs them again; at the newest
revision they do nothing. Reversing it leaves the tables (``duejobs`` owns them, not Django).
"""

from __future__ import annotations

from typing import Any, ClassVar

from django.db import migrations


def upgrade(apps: Any, schema_editor: Any) -> None:
    from duejobs.contrib.django import get_app, settings_urls

    _, _, alias = settings_urls()
    if schema_editor.connection.alias == alias:  # not on the project's other databases
        get_app().migrate()


class Migration(migrations.Migration):
    # duejobs' migrations commit on their own connection: Django's transaction would hold
    # nothing of them.
    atomic = False
    dependencies: ClassVar[list[tuple[str, str]]] = []
    operations: ClassVar[list[migrations.RunPython]] = [
        migrations.RunPython(upgrade, migrations.RunPython.noop, elidable=False)
    ]
