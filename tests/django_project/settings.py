"""A small Django project on duejobs for the test suite: ``DUEJOBS_TEST_DATABASE_URL`` and
``DUEJOBS_TEST_REDIS_URL`` name the servers (the suite's scratch database)."""

import os

from psycopg.conninfo import conninfo_to_dict

from duejobs.config import libpq_url

_db = conninfo_to_dict(libpq_url(os.environ["DUEJOBS_TEST_DATABASE_URL"]))

SECRET_KEY = "tests-only"
USE_TZ = True
INSTALLED_APPS = [
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "duejobs.contrib.django",
    "tests.django_project.shop",
]
MIDDLEWARE = [
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
]
ROOT_URLCONF = "tests.django_project.urls"
ALLOWED_HOSTS = ["testserver", "[::1]"]
DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": _db.get("dbname"),
        "USER": _db.get("user"),
        "PASSWORD": _db.get("password", ""),
        "HOST": _db.get("host", ""),
        "PORT": _db.get("port", ""),
    }
}
DUEJOBS = {"REDIS_URL": os.environ["DUEJOBS_TEST_REDIS_URL"]}
TASKS = {
    "default": {
        "BACKEND": "duejobs.contrib.django.tasks.DuejobsBackend",
        "QUEUES": ["default", "reports"],
        "OPTIONS": {"MAX_ATTEMPTS": 2, "MAX_RESULT_BYTES": 1000},
    }
}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
