"""The test project with a DUEJOBS value duejobs refuses (and one more the check names next):
a system check error naming the key, not a traceback from every command."""

from tests.django_project.settings import *  # noqa: F403

DUEJOBS = {**DUEJOBS, "PREPARED_STATEMENTS": "maybe", "RESULT_TTL": 0}  # noqa: F405
