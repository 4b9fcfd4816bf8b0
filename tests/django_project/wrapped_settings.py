"""The test project on a wrapped PostgreSQL engine (``tests.django_project.wrapped_postgresql``)."""

from tests.django_project.settings import *  # noqa: F403
from tests.django_project.settings import DATABASES

DATABASES = {
    "default": {**DATABASES["default"], "ENGINE": "tests.django_project.wrapped_postgresql"}
}
