"""The test project on SQLite: duejobs' system check refuses it, naming why."""

from tests.django_project.settings import *  # noqa: F403

DATABASES = {"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": ":memory:"}}
