"""The Django application ``duejobs.contrib.django`` (add it to ``INSTALLED_APPS``)."""

from __future__ import annotations

from django.apps import AppConfig
from django.core.exceptions import ImproperlyConfigured
from django.utils.module_loading import autodiscover_modules


class DuejobsConfig(AppConfig):
    name = "duejobs.contrib.django"
    label = "duejobs"
    verbose_name = "duejobs"
    # What is wrong with the settings duejobs reads, found at start-up: reported by the
    # system check ``duejobs.E001`` (``manage.py check``, and before ``runserver``,
    # ``migrate`` and duejobs' own commands) instead of a traceback from every command.
    configuration_error: ImproperlyConfigured | None = None

    def ready(self) -> None:
        """Check the settings duejobs reads, then import every installed application's
        ``jobs`` module and make the duejobs task backends: their handlers are then
        registered in every process (web, worker, shell). With the settings wrong, nothing is
        registered and the system check says why."""
        from duejobs.contrib.django import checks, settings_urls

        checks.register_checks()
        try:
            settings_urls()
        except ImproperlyConfigured as exc:
            self.configuration_error = exc
            return
        autodiscover_modules("jobs")
        from duejobs.contrib.django.tasks import register_backends

        register_backends()
