"""duejobs' tables made by ``manage.py migrate``: duejobs' own migrations (Alembic, the same
as ``duejobs migrate``) run to the newest revision on the database duejobs uses. A duejobs
release that adds a revision adds a Django migration that runs them again; at the newest
revision they do nothing. Reversing it leaves the tables (``duejobs`` owns them, not Django).
"""

from __future__ import annotations

from typing import ClassVar

from django.db import migrations

from duejobs.contrib.django.migrations import upgrade


class Migration(migrations.Migration):
    # duejobs' migrations commit on their own connection: Django's transaction would hold
    # nothing of them.
    atomic = False
    dependencies: ClassVar[list[tuple[str, str]]] = []
    operations: ClassVar[list[migrations.RunPython]] = [
        migrations.RunPython(upgrade, migrations.RunPython.noop, elidable=False)
    ]
