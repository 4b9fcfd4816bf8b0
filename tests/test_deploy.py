"""docker-compose.yml and the Dockerfile, checked without a Docker engine: the services, their
commands (parsed by duejobs' own CLI), health checks, metrics ports and environment."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import click
import pytest
import yaml

from duejobs.cli import main

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    return dict(yaml.safe_load((ROOT / "docker-compose.yml").read_text()))


def test_compose_has_every_part_of_the_system(compose: dict[str, Any]) -> None:
    assert set(compose["services"]) == {
        "postgres",
        "redis",
        "migrate",
        "scheduler",
        "worker",
        "reconciler",
        "pruner",
        "feeder",
    }


def test_schedulers_and_workers_are_replicated(compose: dict[str, Any]) -> None:
    assert compose["services"]["scheduler"]["deploy"]["replicas"] >= 2
    assert compose["services"]["worker"]["deploy"]["replicas"] >= 2


def test_a_worker_that_ends_itself_is_restarted(compose: dict[str, Any]) -> None:
    """A worker whose handler will not return past its timeout exits (status 70) for its
    supervisor to start a fresh one: every long-running duejobs service is restarted."""
    for name in ("scheduler", "worker", "reconciler", "pruner"):
        assert compose["services"][name]["restart"] in ("always", "unless-stopped", "on-failure")


def test_every_service_has_a_health_check_or_is_one_shot(compose: dict[str, Any]) -> None:
    for name, service in compose["services"].items():
        if name == "migrate":
            assert service["restart"] == "no"
            continue
        assert "healthcheck" in service, name


@pytest.mark.parametrize("name", ["migrate", "scheduler", "worker", "reconciler", "pruner"])
def test_duejobs_commands_parse_with_the_real_cli(compose: dict[str, Any], name: str) -> None:
    args = [
        a.replace("${DUEJOBS_APP:-duejobs.dev.demo:app}", "duejobs.dev.demo:app")
        for a in compose["services"][name]["command"]
    ]
    command = main.get_command(click.Context(main), args[0])
    assert command is not None, args[0]
    command.make_context(args[0], args[1:])  # raises on an unknown option or bad value


def test_the_feeder_schedules_demo_work_with_a_command_the_cli_takes(
    compose: dict[str, Any],
) -> None:
    """``docker compose up`` shows work flowing: the feeder schedules a type of the demo's
    App, given that App (a typo refused at once). Seen failing with nothing scheduling."""
    feeder = compose["services"]["feeder"]
    assert feeder["entrypoint"] == ["sh", "-c"]
    words = shlex.split(feeder["command"][0])
    args = words[words.index("duejobs") + 1 : words.index(">")]
    assert args[:2] == ["schedule", "send-reminder"] and "duejobs.dev.demo:app" in args
    command = main.get_command(click.Context(main), args[0])
    assert command is not None
    command.make_context(args[0], args[1:])


def test_the_workers_default_app_imports_with_the_images_install_alone() -> None:
    """The image installs ``.[binary]``: the demo's handlers, which the workers load by
    default, import without the demo's progress display (``rich``). Seen failing with an
    import error and a restart loop."""
    code = "import sys; sys.modules['rich'] = None; import duejobs.dev.demo; print('imported')"
    env = {
        **os.environ,
        "DUEJOBS_DATABASE_URL": "postgresql://u@db/x",
        "DUEJOBS_REDIS_URL": "redis://r",
    }
    done = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0 and "imported" in done.stdout, done.stderr


@pytest.mark.parametrize(
    ("name", "port"),
    [("scheduler", "9101"), ("worker", "9102"), ("reconciler", "9103"), ("pruner", "9104")],
)
def test_metrics_ports_are_served_and_health_checked(
    compose: dict[str, Any], name: str, port: str
) -> None:
    service = compose["services"][name]
    assert service["command"][service["command"].index("--metrics-port") + 1] == port
    assert port in service["expose"] and f"localhost:{port}/metrics" in str(service["healthcheck"])


def test_processes_wait_for_a_migrated_database_and_a_healthy_redis(
    compose: dict[str, Any],
) -> None:
    services = compose["services"]
    assert services["migrate"]["depends_on"]["postgres"]["condition"] == "service_healthy"
    for name in ("scheduler", "worker", "reconciler"):
        needs = services[name]["depends_on"]
        assert needs["migrate"]["condition"] == "service_completed_successfully"
        assert needs["redis"]["condition"] == "service_healthy"


def test_urls_point_at_the_compose_services(compose: dict[str, Any]) -> None:
    postgres = compose["services"]["postgres"]["environment"]
    for name in ("migrate", "scheduler", "worker", "reconciler", "pruner"):
        env = compose["services"][name]["environment"]
        assert env["DUEJOBS_DATABASE_URL"] == (
            f"postgresql://{postgres['POSTGRES_USER']}:{postgres['POSTGRES_PASSWORD']}"
            f"@postgres:5432/{postgres['POSTGRES_DB']}"
        )
        assert env["DUEJOBS_REDIS_URL"].startswith("redis://redis:6379/")


def test_dockerfile_copies_what_exists_and_runs_the_cli() -> None:
    lines = (ROOT / "Dockerfile").read_text().splitlines()
    for line in lines:
        if line.startswith("COPY "):
            for source in line.split()[1:-1]:
                assert (ROOT / source).exists(), source
    assert 'ENTRYPOINT ["duejobs"]' in lines


def test_the_image_carries_the_license_the_package_declares() -> None:
    copied = [
        source
        for line in (ROOT / "Dockerfile").read_text().splitlines()
        if line.startswith("COPY ")
        for source in line.split()[1:-1]
    ]
    assert "LICENSE" in copied


def test_the_build_context_leaves_out_virtualenvs_caches_and_the_repository() -> None:
    """Seen failing without a .dockerignore: a context of 750 MB after ``make demo``."""
    ignored = (ROOT / ".dockerignore").read_text().split()
    for heavy in (".git", ".venv*", ".duejobs", "site", "mutants", "**/__pycache__"):
        assert heavy in ignored, heavy
    copied = {
        source
        for line in (ROOT / "Dockerfile").read_text().splitlines()
        if line.startswith("COPY ")
        for source in line.split()[1:-1]
    }
    assert not copied & set(ignored), "the image copies what the context leaves out"


def _documented_commands() -> list[str]:
    """The ``duejobs ...`` commands of the operations page's table of processes."""
    text = (ROOT / "docs" / "operations.md").read_text()
    return [
        cell.strip("` ")
        for line in text.splitlines()
        if line.startswith("| `duejobs ")
        for cell in [line.split("|")[1]]
    ]


@pytest.mark.parametrize("line", _documented_commands())
def test_the_documented_commands_parse_with_the_real_cli(line: str) -> None:
    """Seen failing with ``duejobs prune --every 1h``: its --older-than is required."""
    args = [a.replace("module:app", "duejobs.dev.demo:app") for a in shlex.split(line)[1:]]
    command = main.get_command(click.Context(main), args[0])
    assert command is not None, args[0]
    command.make_context(args[0], args[1:])
