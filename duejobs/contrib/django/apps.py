"""The Django application ``duejobs.contrib.django`` (add it to ``INSTALLED_APPS``)."""

from __future__ import annotations

from django.apps import AppConfig
from django.utils.module_loading import autodiscover_modules


class DuejobsConfig(AppConfig):
    name = "duejobs.contrib.django"
    label = "duejobs"
    verbose_name = "duejobs"

    def ready(self) -> None:
        """Import every installed application's ``jobs`` module, and make the duejobs task
        backends: their handlers are then registered in every process (web, worker, shell)."""
        autodiscover_modules("jobs")
        from duejobs.contrib.django.tasks import register_backends

        register_backends()
