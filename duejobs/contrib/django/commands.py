"""What the management commands share: each runs one command of duejobs' CLI, with its
options, against the database and Redis the Django settings name."""

from __future__ import annotations

import contextlib
import io
import os
from typing import Any

from django.core.management.base import BaseCommand, CommandError

from duejobs.cli.group import run_alone
from duejobs.config import DATABASE_ENV, REDIS_ENV
from duejobs.contrib.django import settings_urls

# Django's options every management command takes: applied by Django before a command runs
# (``--settings``, ``--pythonpath``), or of no use to duejobs' commands, whose logs have
# their own ``--log-level``. Those with a value, then the flags.
_DJANGO_VALUED = ("--settings", "--pythonpath", "--verbosity", "-v")
_DJANGO_FLAGS = ("--traceback", "--no-color", "--force-color", "--skip-checks")


class CliCommand(BaseCommand):
    """``manage.py duejobs_<command> [options]`` = ``duejobs <command> [options]`` with the
    settings' URLs (and the project's App, where the command takes one). Django's own
    options are accepted and dropped."""

    cli_command: str
    takes_app = False

    def add_arguments(self, parser: Any) -> None:
        # A default makes it optional to argparse, so call_command takes it by keyword too
        # (options=[...]): a required one it would ask for by an option string it has none of.
        parser.add_argument(
            "options", nargs="*", default=[], help="the options of `duejobs COMMAND`"
        )

    def create_parser(self, prog_name: str, subcommand: str, **kwargs: Any) -> Any:
        """Django's parser, but for ``call_command``'s arguments: every one of them is an
        option of the CLI's (``--burst``), handed over whole — Django's own options come to
        ``call_command`` as keywords."""
        parser = super().create_parser(prog_name, subcommand, **kwargs)
        parse = parser.parse_args

        def parse_args(args: list[str] | None = None, namespace: Any = None) -> Any:
            if args is None:  # from argv: run_from_argv hands the options over itself
                return parse(args, namespace)
            parsed = parse([], namespace)
            parsed.options = list(args)
            return parsed

        parser.parse_args = parse_args
        return parser

    def run_from_argv(self, argv: list[str]) -> None:
        """From ``manage.py``: every option goes to the CLI but Django's own."""
        self._run(_without_django_options(argv[2:]))

    def handle(self, *args: Any, **options: Any) -> None:
        """From ``call_command``: positional arguments (and ``options=[...]``) are the CLI's
        options; what it prints goes to the command's ``stdout`` and ``stderr`` (the
        ``stdout=``/``stderr=`` given, else the process's); a failure is a ``CommandError``
        (its message is already on stderr)."""
        try:
            with (
                contextlib.redirect_stdout(_Into(self.stdout)),
                contextlib.redirect_stderr(_Into(self.stderr)),
            ):
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
        run_alone(
            self.cli_command,
            args,
            prog_name=f"manage.py duejobs_{self.cli_command.replace('-', '_')}",
            app="duejobs.contrib.django:app" if self.takes_app else None,
        )


class _Into(io.TextIOBase):
    """A text stream into a command's output (Django's ``OutputWrapper``), written as given:
    the wrapper's own line ending is not added to each write."""

    def __init__(self, wrapper: Any) -> None:
        self._wrapper = wrapper

    @property
    def encoding(self) -> str:  # type: ignore[override]
        return "utf-8"

    def writable(self) -> bool:
        return True

    def write(self, text: str) -> int:
        self._wrapper.write(text, ending="")
        return len(text)

    def flush(self) -> None:
        self._wrapper.flush()


def _without_django_options(args: list[str]) -> list[str]:
    given, skip = [], False
    for arg in args:
        if skip:
            skip = False
        elif arg in _DJANGO_VALUED:
            skip = True
        elif not _django_own(arg):
            given.append(arg)
    return given


def _django_own(arg: str) -> bool:
    """A flag of Django's, or one of its options with its value attached (``-v2``)."""
    valued = arg.startswith(tuple(f"{o}=" for o in _DJANGO_VALUED))
    return arg in _DJANGO_FLAGS or valued or (arg.startswith("-v") and arg[2:].isdigit())
