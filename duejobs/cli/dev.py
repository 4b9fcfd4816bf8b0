"""``duejobs dev``: everything in one process, for development."""

from __future__ import annotations

import shlex
import sys
import threading
from datetime import timedelta

import click

from duejobs.cli.base import (
    POSITIVE,
    _app,
    _checked,
    _operate,
    load_app,
    say,
    sync_declared,
)
from duejobs.cli.group import main
from duejobs.scheduler.loop import Scheduler
from duejobs.services.partition_maintenance import PartitionMaintenance
from duejobs.services.pruner import PruneConfig, Pruner
from duejobs.services.reconciler import Reconciler
from duejobs.worker import WorkerConfig, build_worker

# How often the reconciler and the pruner pass in development.
RECONCILE_EVERY = timedelta(seconds=2)
PRUNE_EVERY = timedelta(hours=1)


@main.command()
@click.option("--app", "app_ref", required=True, help="MODULE:APP with the handlers.")
@click.option(
    "--concurrency", type=click.IntRange(1, 256), default=4, show_default=True, help="Slots."
)
@click.option(
    "--prune-older-than",
    type=POSITIVE,
    default="7d",
    show_default=True,
    help="The pruner deletes finished schedules older than this.",
)
@click.option(
    "--log-level",
    type=click.Choice(["debug", "info", "warning", "error"]),
    default="info",
    show_default=True,
)
@click.option(
    "--log-format", type=click.Choice(["text", "json"]), default="text", show_default=True
)
@click.pass_context
def dev(
    ctx: click.Context,
    app_ref: str,
    concurrency: int,
    prune_older_than: timedelta,
    log_level: str,
    log_format: str,
) -> None:
    """Scheduler, worker, reconciler and pruner in one process, for development."""
    _operate(log_level, log_format, None)
    config = _checked(lambda: WorkerConfig(concurrency=concurrency))
    pruning = _checked(lambda: PruneConfig(older_than=prune_older_than))
    with _app(ctx, migrate=True, embedded=True) as configured:
        app = load_app(app_ref)
        sync_declared(app)
        del configured  # the servers are up and the schema migrated; the handlers' App runs
        scheduler, reconciler, pruner = Scheduler(app), Reconciler(app), Pruner(app, pruning)
        partitions = PartitionMaintenance(app)
        loops = [
            threading.Thread(target=scheduler.run, name="scheduler", daemon=True),
            threading.Thread(
                target=reconciler.run, args=(RECONCILE_EVERY,), name="reconciler", daemon=True
            ),
            threading.Thread(target=pruner.run, args=(PRUNE_EVERY,), name="pruner", daemon=True),
            threading.Thread(target=partitions.run, name="partitions", daemon=True),
        ]
        for loop in loops:
            loop.start()
        say(
            f"duejobs dev: scheduler, worker ({concurrency} slots), reconciler and pruner in "
            "this process; Ctrl-C stops them (code is not reloaded: restart to load changes). "
            "In another shell, the duejobs commands find these servers, and "
            '`eval "$(duejobs env)"` lets your own code\'s App() find them too'
        )
        worker = build_worker(app, config)
        try:
            # The worker in the main thread: SIGINT/SIGTERM end it (warm), then the rest.
            worker.work()
        finally:
            for service in (scheduler, reconciler, pruner, partitions):
                service.stop()
            for loop in loops:
                loop.join(timeout=30)
            worker.runtime.close()
            scheduler.close()
            app.close()


@main.command(name="env")
@click.pass_context
def env_exports(ctx: click.Context) -> None:
    """Print the shell lines that point your own code at the servers of the `duejobs dev`
    running here (same --data-dir): `eval "$(duejobs env)"`."""
    from duejobs.config import DATABASE_ENV, REDIS_ENV
    from duejobs.dev.embedded import embedded_running, start_embedded

    data_dir = ctx.obj["data_dir"]
    if not embedded_running(data_dir):
        click.echo(
            f"error: no `duejobs dev` (or demo) runs on {data_dir}: start one, or set "
            f"{DATABASE_ENV} and {REDIS_ENV} yourself",
            err=True,
        )
        sys.exit(2)
    joined = start_embedded(data_dir)  # joined: running already, its URLs read
    try:
        for name, url in ((DATABASE_ENV, joined.database_url), (REDIS_ENV, joined.redis_url)):
            click.echo(f"export {name}={shlex.quote(url)}")
    finally:
        joined.stop()
