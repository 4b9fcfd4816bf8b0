"""What the management commands share: each runs one command of duejobs' CLI, with its
options, against the database and Redis the Django settings name."""

from __future__ import annotations

import os
from typing import Any

from django.core.management.base import BaseCommand, CommandError

from duejobs.cli import main
from duejobs.config import DATABASE_ENV, REDIS_ENV
from duejobs.contrib.django import settings_urls

# Options of Django's own command line, already applied by the time a command runs.
_DJANGO_OPTIONS = ("--settings", "--pythonpath")


class CliCommand(BaseCommand):
    """``manage.py duejobs_<command> [options]`` = ``duejobs <command> [options]`` with the
    settings' URLs (and the project's App, where the command takes one)."""

    cli_command: str
    takes_app = False

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("options", nargs="*", help="the options of `duejobs COMMAND`")

    def run_from_argv(self, argv: list[str]) -> None:
        """From ``manage.py``: every option goes to the CLI (Django's own are dropped)."""
        given, skip = [], False
        for arg in argv[2:]:
            if skip:
                skip = False
            elif arg in _DJANGO_OPTIONS:
                skip = True
            elif not arg.startswith(tuple(f"{o}=" for o in _DJANGO_OPTIONS)):
                given.append(arg)
        self._run(given)

    def handle(self, *args: Any, **options: Any) -> None:
        """From ``call_command``: positional arguments are the CLI's options; a failure is a
        ``CommandError`` (its message is already on stderr)."""
        try:
            self._run([*options.get("options", []), *args])
        except SystemExit as done:
            if done.code not in (0, None):
                status = f"duejobs {self.cli_command} exited with status {done.code}"
                raise CommandError(status) from None

    def _run(self, args: list[str]) -> None:
        """Run the CLI command; it ends with ``SystemExit`` carrying its status."""
        database_url, redis_url, _ = settings_urls()
        os.environ[DATABASE_ENV] = database_url
        if redis_url:
            os.environ[REDIS_ENV] = redis_url
        if self.takes_app and "--app" not in args:
            args = ["--app", "duejobs.contrib.django:app", *args]
        main.main(
            args=[self.cli_command, *args],
            prog_name=f"manage.py duejobs_{self.cli_command}",
        )
