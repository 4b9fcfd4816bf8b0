"""Redis nodes: ``nodes drain``, for the queues that moved off one."""

from __future__ import annotations

import json
from dataclasses import asdict

import click

from duejobs.cli.base import _app, _fail
from duejobs.cli.group import main
from duejobs.errors import ConfigurationError
from duejobs.services.node_drain import DrainConfig, NodeDrain


@main.group()
def nodes() -> None:
    """Redis nodes (DUEJOBS_REDIS_NODES): drain one that queues moved off."""


@nodes.command()
@click.argument("url")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.pass_context
def drain(ctx: click.Context, url: str, as_json: bool) -> None:
    """Move the jobs waiting on the Redis at URL for queues that live on another node now
    (DUEJOBS_REDIS_NODES changed) onto their queues' nodes, then take them off URL. Queues
    that still live at URL are left alone. Run it after the services use the new mapping,
    and again until it reports nothing left and no job started there."""
    try:
        config = DrainConfig(url)
    except ConfigurationError as exc:
        _fail(ValueError(str(exc)))
    with _app(ctx) as app:
        result = NodeDrain(app, config).run_once()
    if as_json:
        click.echo(json.dumps(asdict(result)))
        return
    if not result.found:
        click.echo(f"node {result.node}: nothing left behind by queues that moved off it")
    else:
        by_queue = ", ".join(f"{q} {n}" for q, n in sorted(result.found.items()))
        click.echo(
            f"node {result.node}: {sum(result.found.values())} waiting jobs of queues that "
            f"moved off it ({by_queue}): {result.moved} pushed onto their queues' nodes, "
            f"{result.dropped} no longer needed by their schedules; {result.taken_off} taken off"
        )
    if result.started:
        click.echo(
            f"{result.started} jobs started by workers on {result.node} still run there: "
            "keep those workers until this says none"
        )
    else:
        click.echo(f"no job running on {result.node}: its workers for those queues may stop")
