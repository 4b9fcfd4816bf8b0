"""The test project with duejobs on a database alias of its own, ``jobs``, whose server is
down (nothing listens on its port): the project's own database answers."""

from tests.django_project.settings import *  # noqa: F403
from tests.django_project.settings import DATABASES, DUEJOBS

DATABASES = {
    **DATABASES,
    "jobs": {**DATABASES["default"], "HOST": "127.0.0.1", "PORT": "1"},
}
DUEJOBS = {**DUEJOBS, "DATABASE": "jobs"}
