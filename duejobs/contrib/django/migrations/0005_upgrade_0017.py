"""duejobs' revisions up to 0017 (rate limits paced by the scheduler), run by
``manage.py migrate`` as ``0001_schema`` runs them: to the newest revision this release knows.
"""

from __future__ import annotations

from typing import ClassVar

from django.db import migrations

from duejobs.contrib.django.migrations import upgrade


class Migration(migrations.Migration):
    atomic = False  # duejobs' migrations commit on their own connection
    dependencies: ClassVar[list[tuple[str, str]]] = [("duejobs", "0004_upgrade_0016")]
    operations: ClassVar[list[migrations.RunPython]] = [
        migrations.RunPython(upgrade, migrations.RunPython.noop, elidable=False)
    ]
