"""``duejobs worker``: its flags (one per :class:`~duejobs.worker.WorkerConfig` knob) and
the worker, or the supervisor of several. Only click, the knobs and the CLI's own helpers are
imported to show ``--help``; the App, the worker and RQ when the command runs."""

from __future__ import annotations

import dataclasses
import logging
import sys
from datetime import timedelta
from typing import Any

import click

from duejobs.cli.base import (
    CpuList,
    F,
    _checked,
    _fail,
    _operate,
    _operations,
    duration_option,
    load_app,
    ready_to_serve,
    say_serving,
    services,
    sync_declared,
)
from duejobs.cli.group import main
from duejobs.errors import ConfigurationError, DuejobsError, describe
from duejobs.timespec import spell_duration
from duejobs.worker.config import WorkerConfig


def _flag(knob: dataclasses.Field[Any]) -> str:
    return "--" + knob.name.replace("_", "-")


def _worker_knobs(command: F) -> F:
    """One flag per field of :class:`WorkerConfig`, its default, bounds and help taken from
    the field (a duration as the CLI spells durations, a switch as ``--x/--no-x``)."""
    for knob in reversed(dataclasses.fields(WorkerConfig)):
        flag, about, default = _flag(knob), knob.metadata["help"], knob.default
        if isinstance(default, bool):
            negative = f"--no-{flag.removeprefix('--')}"
            option = click.option(
                f"{flag}/{negative}", default=default, show_default=True, help=about
            )
        elif isinstance(default, timedelta):
            option = duration_option(
                flag, default, about, zero_ok=knob.metadata.get("zero_ok", False)
            )
        else:
            bounds = click.IntRange(knob.metadata["low"], knob.metadata["high"])
            option = click.option(flag, type=bounds, default=default, show_default=True, help=about)
        command = option(command)
    return command


def _knob_flags(config: WorkerConfig) -> list[str]:
    """The flags that give a worker started by the supervisor this ``config``."""
    flags = []
    for knob in dataclasses.fields(config):
        value = getattr(config, knob.name)
        if isinstance(value, bool):
            flags.append(_flag(knob) if value else f"--no-{_flag(knob).removeprefix('--')}")
        elif isinstance(value, timedelta):
            flags.append(f"{_flag(knob)}={spell_duration(value)}")
        else:
            flags.append(f"{_flag(knob)}={value}")
    return flags


@main.command()
@click.option("--app", "app_ref", required=True, help="MODULE:APP with the handlers.")
@click.option("--burst", is_flag=True, help="Exit once the queue is empty.")
@click.option(
    "--queue",
    "queues",
    multiple=True,
    help="RQ queue to take jobs from; repeat for several, in priority order (default: the App's).",
)
@click.option("--name", help="Worker name (default: host:pid).")
@_worker_knobs
@click.option(
    "--cpus",
    type=CpuList(),
    default=None,
    metavar="LIST",
    help="Pin each worker process to one of these CPUs (e.g. 1, or 0,1: the i-th process of "
    "--processes takes the i-th, round robin; a lone worker the first). Its slots' threads "
    "then wake each other on one CPU, far cheaper than across CPUs on virtual machines. "
    "Default: not pinned.",
)
@click.option(
    "--processes",
    type=click.IntRange(1, 256),
    default=1,
    show_default=True,
    help="Worker processes under one supervisor that starts again any that exits; each "
    "serves metrics on --metrics-port plus its index.",
)
@_operations
@click.pass_context
def worker(
    ctx: click.Context,
    /,
    app_ref: str,
    burst: bool,
    queues: tuple[str, ...],
    name: str | None,
    cpus: tuple[int, ...] | None,
    processes: int,
    log_level: str,
    log_format: str,
    metrics_port: int | None,
    **knobs: Any,
) -> None:
    """Run an RQ worker for the App's handlers. SIGTERM/SIGINT: take no more jobs, finish
    the running ones, then exit; a second one ends the worker at once."""
    from duejobs.worker import build_worker
    from duejobs.worker.supervisor import Supervisor, allowed_cpus, pin_to_cpu

    if cpus:
        try:
            allowed = allowed_cpus()
        except DuejobsError as exc:
            raise click.BadParameter(str(exc), param_hint="--cpus") from exc
        if not set(cpus) <= allowed:
            refused = sorted(set(cpus) - allowed)
            raise click.BadParameter(
                f"CPUs {refused} are not ones this process may run on ({sorted(allowed)})",
                param_hint="--cpus",
            )
    _operate(log_level, log_format, metrics_port if processes == 1 else None)
    config = _checked(lambda: WorkerConfig(**knobs))
    if processes > 1:
        shared = ["worker", "--app", app_ref, *(f"--queue={q}" for q in queues)]
        shared += [*_knob_flags(config), f"--log-level={log_level}"]
        shared += [f"--log-format={log_format}", *(["--burst"] if burst else [])]

        def child(index: int, starts: int) -> list[str]:
            # RQ refuses a name still registered by a worker that ended without deregistering
            # (killed, or ended for its supervisor): each start gets a name of its own.
            named = f"{name}-{index}" + (f".{starts}" if starts > 1 else "")
            return [
                *shared,
                *([f"--name={named}"] if name else []),
                *([f"--metrics-port={metrics_port + index}"] if metrics_port is not None else []),
                *([f"--cpus={cpus[index % len(cpus)]}"] if cpus else []),
            ]

        with services(ctx.obj["data_dir"]):
            sys.exit(Supervisor(processes, child, burst=burst).run())
    with services(ctx.obj["data_dir"]):
        if cpus:  # after the embedded servers start (they keep every CPU), before the
            pin_to_cpu(cpus[0])  # worker's threads start (they inherit it)
        app = load_app(app_ref)
        ready_to_serve(app)
        sync_declared(app)
        try:
            worker = build_worker(app, config, queues, name=name)
        except ConfigurationError as exc:  # queues on several nodes: bad flags, exit 2
            raise click.BadParameter(str(exc), param_hint="--queue") from exc
        except DuejobsError as exc:
            _fail(exc)
        served = ", ".join(repr(q) for q in queues) if queues else repr(app.queue)
        slots = f"{config.concurrency} slot" + ("s" if config.concurrency != 1 else "")
        try:
            with worker.signals():
                say_serving(app, "worker", f"queues {served}, {slots}")
                worker.runtime.warn_if_outcomes_can_be_lost()
                worker.work(burst=burst)
        except Exception as exc:  # not an outage (those are waited out): a refused password
            logging.getLogger("duejobs.worker").error("duejobs worker: ended by %s", describe(exc))
            sys.exit(1)
        finally:
            worker.runtime.close()
            app.close()
