"""The ``duejobs`` group: its commands found by name and imported only when one runs, so
that ``duejobs --help`` and ``--version`` load click and nothing of SQLAlchemy, Alembic, Redis
or RQ (``tests/test_cli.py`` checks both, and that this table matches the commands)."""

from __future__ import annotations

import copy
import importlib
import os
import sys
from pathlib import Path
from typing import Any, NoReturn

import click

from duejobs.errors import DriverMissingError

# The embedded servers' folder (``duejobs.dev.embedded.DEFAULT_DATA_DIR``, not imported here).
DATA_DIR = Path(".duejobs")

# Each command: the module of duejobs.cli that defines it, and its line in ``--help``.
COMMANDS: dict[str, tuple[str, str]] = {
    "cancel": ("schedules", "Cancel a schedule by SCHEDULE_ID or --key..."),
    "dashboard": ("dashboard", "Serve the dashboard: overview, schedules,..."),
    "demo": ("admin", "The whole system end to end: scheduler,..."),
    "dev": ("dev", "Scheduler, worker, reconciler and pruner..."),
    "env": ("dev", "Print the shell lines that point your own..."),
    "list": ("schedules", "List schedules by due time, a page at a..."),
    "migrate": ("admin", "Create or upgrade the schema (idempotent,..."),
    "nodes": ("nodes", "Redis nodes (DUEJOBS_REDIS_NODES): drain..."),
    "partitions": ("admin", "The partitions of partitioned mode: each..."),
    "prune": ("services", "Delete finished schedules (and their..."),
    "quota": ("admin", "Set TENANT's quotas ('*' sets the..."),
    "rate-limit": ("admin", "Limit the starts of QUEUE to RATE ('10/s',..."),
    "reconcile": ("services", "Heal drift between PostgreSQL and Redis:..."),
    "recurring": ("admin", "Recurring schedules: cron in a time zone,..."),
    "reschedule": ("schedules", "Move a schedule (by SCHEDULE_ID or --key)..."),
    "retry": ("schedules", "Schedule a failed or cancelled schedule..."),
    "run-now": ("schedules", "Make a live schedule (by SCHEDULE_ID or..."),
    "schedule": ("schedules", "Schedule JOB_TYPE --in DURATION or --at TIME."),
    "scheduler": ("services", "Run the windowed scheduler until..."),
    "show": ("schedules", "Show a schedule (by SCHEDULE_ID, or --key:..."),
    "stats": ("services", "Lag, late jobs, orphans and counts,..."),
    "worker": ("worker", "Run an RQ worker for the App's handlers."),
}


def as_program(command: click.Command, args: Any, kwargs: dict[str, Any]) -> NoReturn:
    """Run ``command`` (the group, or one command alone): bad flags are one line on stderr
    and exit status 2 (no usage block to scroll past)."""
    kwargs["standalone_mode"] = False
    try:
        code = click.Command.main(command, *args, **kwargs)
    except click.UsageError as exc:
        click.echo(f"error: {exc.format_message()}", err=True)
        sys.exit(2)
    except click.Abort:
        click.echo("aborted", err=True)
        sys.exit(1)
    except click.ClickException as exc:
        click.echo(f"error: {exc.format_message()}", err=True)
        sys.exit(exc.exit_code)
    except DriverMissingError as exc:  # an install without a libpq: no retry helps
        click.echo(f"error: {exc}", err=True)
        sys.exit(2)
    sys.exit(code if isinstance(code, int) else 0)


class _Cli(click.Group):
    """Commands imported on first use (:data:`COMMANDS`); bad flags are one line on stderr
    and exit status 2 (see :func:`as_program`)."""

    def main(self, *args: Any, **kwargs: Any) -> Any:
        as_program(self, args, kwargs)

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(COMMANDS)

    def get_command(self, ctx: click.Context | None, name: str) -> click.Command | None:
        if name not in self.commands and name in COMMANDS:
            importlib.import_module(f"duejobs.cli.{COMMANDS[name][0]}")  # it adds its commands
        return self.commands.get(name)

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        with formatter.section("Commands"):
            formatter.write_dl([(name, COMMANDS[name][1]) for name in sorted(COMMANDS)])


@click.group(cls=_Cli)
@click.option(
    "--data-dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=DATA_DIR,
    show_default=True,
    help="Where the embedded servers of `duejobs demo` keep their data.",
)
@click.option(
    "--prepared-statements",
    type=click.Choice(["auto", "on", "off"]),
    default=None,
    help="Whether connections keep prepared statements (DUEJOBS_PREPARED_STATEMENTS; "
    "default auto: none through a connection pooler).",
)
@click.option(
    "--result-ttl",
    default=None,
    metavar="DURATION",
    help="How long a finished or failed job's hash, result and registry entry stay in Redis "
    "(DUEJOBS_RESULT_TTL; default 500s, RQ's).",
)
@click.version_option(package_name="duejobs", prog_name="duejobs")
@click.pass_context
def main(
    ctx: click.Context, data_dir: Path, prepared_statements: str | None, result_ttl: str | None
) -> None:
    """duejobs: durable delayed and scheduled jobs on PostgreSQL and RQ."""
    ctx.ensure_object(dict)
    ctx.obj["data_dir"] = data_dir
    # Both for every App of this process, --app's included (not imported for --help).
    if prepared_statements is not None:
        from duejobs.config import PREPARED_STATEMENTS_ENV

        os.environ[PREPARED_STATEMENTS_ENV] = prepared_statements
    if result_ttl is not None:
        from duejobs.config import RESULT_TTL_ENV, check_result_ttl
        from duejobs.errors import ConfigurationError

        try:
            check_result_ttl(result_ttl)
        except ConfigurationError as exc:
            raise click.BadParameter(str(exc), param_hint="--result-ttl") from None
        os.environ[RESULT_TTL_ENV] = result_ttl


def run_alone(name: str, args: list[str], prog_name: str, app: str | None = None) -> NoReturn:
    """One command of ``duejobs`` run as a program of its own (a Django management command):
    its usage says ``prog_name [OPTIONS]``; with ``app``, ``--app`` is that App unless given,
    and is left out of ``--help``."""
    found = main.get_command(None, name)
    assert found is not None, name
    command = copy.copy(found)
    if app is not None:
        command.params = [_defaulted(param, app) for param in command.params]
    as_program(command, (), {"args": args, "prog_name": prog_name, "obj": {"data_dir": DATA_DIR}})


def _defaulted(param: click.Parameter, app: str) -> click.Parameter:
    if param.name != "app_ref" or not isinstance(param, click.Option):
        return param
    given = copy.copy(param)
    given.required, given.hidden, given.default = False, True, app
    return given
