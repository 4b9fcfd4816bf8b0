"""What a newcomer runs before any code: every install line of the README and docs/, and the
compose file's demo, each in a new virtualenv (``make test-install``, in ``make test-all``:
each installs from PyPI's index, 10 to 60 s a line, so they are not part of ``make test``).

Not run here: ``make test`` (this suite) and ``make demo`` (``tests/test_cli.py`` runs the
demo's command; the target only installs ``.venv`` first, as ``make test`` does)."""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import time
import uuid
from pathlib import Path
from typing import Any

import psycopg
import pytest
import yaml

from duejobs.config import libpq_url
from tests.support import wait_for
from tests.support.installs import (
    CHECKOUT,
    InstallLine,
    in_venv,
    install_lines,
    missing_requirements,
    new_venv,
    run_in,
)
from tests.support.processes import ROOT
from tests.support.servers import Servers

pytestmark = pytest.mark.install

_DISTINCT: dict[str, InstallLine] = {}
for _line in install_lines():
    _DISTINCT.setdefault(_line.shell, _line)


@pytest.mark.parametrize("line", list(_DISTINCT.values()), ids=str)
def test_every_install_line_of_the_docs_works_in_a_new_virtualenv(
    line: InstallLine, tmp_path: Path
) -> None:
    """Run as a reader runs it, from the checkout (a page's ``path/to/duejobs`` is this
    checkout; the README's wheel line builds the wheel with ``make dist``): duejobs imports,
    its command answers, and every requirement of the extras the line names is installed.
    Seen failing on the README's wheel line while its glob was quoted."""
    bin_ = new_venv(tmp_path / "venv")
    run_in(bin_, line.shell, ROOT)
    assert missing_requirements(bin_, line.extras) == []
    out = run_in(bin_, "python -c 'import duejobs, psycopg; print(duejobs.__version__)'", tmp_path)
    assert out.strip() == run_in(bin_, "duejobs --version", tmp_path).split()[-1]


def test_the_compose_demo_runs_from_the_images_install(
    tmp_path: Path, servers: Servers, redis_url: str
) -> None:
    """The image's own install (the Dockerfile's COPY and RUN lines, in a new virtualenv
    instead of a container) runs the compose file's services as they are written — its
    migration, then the scheduler, a worker of the demo handlers, the reconciler, the pruner
    and the feeder — against the test servers (metrics ports moved to free ones: here the
    processes share one host), until a reminder the feeder scheduled has run. The feeder
    schedules ten seconds ahead: about fifteen seconds of the test. Seen failing when the
    image's install lacked what the demo's handlers import."""
    app_dir = tmp_path / "app"
    bin_ = new_venv(tmp_path / "venv")
    run_in(bin_, _image_install(app_dir), app_dir)
    compose: dict[str, Any] = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    services = compose["services"]
    database = f"duejobs_compose_{uuid.uuid4().hex[:8]}"
    database_url = servers.create_database(database)
    urls = {"DUEJOBS_DATABASE_URL": database_url, "DUEJOBS_REDIS_URL": redis_url}
    env = {**in_venv(bin_), **urls}
    procs: dict[str, subprocess.Popen[bytes]] = {}
    try:
        run_in(bin_, _command(services["migrate"]), tmp_path, env=urls)  # the one-shot, first
        for name in ("scheduler", "worker", "reconciler", "pruner", "feeder"):
            log = open(tmp_path / f"{name}.log", "wb")  # noqa: SIM115 - the child keeps it
            procs[name] = subprocess.Popen(
                ["bash", "-c", _command(services[name])],
                cwd=tmp_path,
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        wait_for(
            lambda: (
                _succeeded(database_url) > 0 or any(p.poll() is not None for p in procs.values())
            ),
            90,
            "a reminder the feeder scheduled to run",
        )
        ended = {n: p.returncode for n, p in procs.items() if p.poll() is not None}
        assert ended == {}, _logs(tmp_path, ended)
        assert _succeeded(database_url) > 0
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in procs.values():
            proc.wait(timeout=60)
        servers.drop_database(database)


def test_the_tutorial_runs_as_written(tmp_path: Path, servers: Servers, redis_url: str) -> None:
    """docs/tutorial.md, block by block as a reader runs it, in a new folder: its install and
    migration (the URLs its exports give replaced with the test servers'), ``reminders.py``
    saved, its three processes started, its schedule made — and run ten seconds later, as
    the page says —, then its reschedule and cancel. About twenty seconds of the test. Seen
    failing with the worker's ``--app`` mistyped on the page."""
    blocks = re.findall(r"```(\w*)\n(.*?)```", (ROOT / "docs/tutorial.md").read_text(), re.S)
    (_, setup), (_, module), (_, processes), (_, schedule), (_, change) = blocks
    database = f"duejobs_tutorial_{uuid.uuid4().hex[:8]}"
    urls = {
        "DUEJOBS_DATABASE_URL": servers.create_database(database),
        "DUEJOBS_REDIS_URL": redis_url,
    }
    for name, url in urls.items():
        setup = re.sub(rf"^export {name}=.*$", f"export {name}={url}", setup, flags=re.M)
    env = {k: v for k, v in os.environ.items() if k not in {"PYTHONPATH", *urls}}
    procs: list[subprocess.Popen[bytes]] = []

    def shell(script: str) -> str:
        done = subprocess.run(
            ["bash", "-ec", script],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=900,
        )
        assert done.returncode == 0, f"{script}\n{done.stdout}{done.stderr}"
        return done.stdout

    try:
        shell(setup.replace(CHECKOUT, str(ROOT)))
        (tmp_path / "reminders.py").write_text(module)
        exports = "".join(f"export {name}={url}\n" for name, url in urls.items())
        ready = f". .venv/bin/activate\n{exports}"
        for i, line in enumerate(processes.splitlines()):
            log = open(tmp_path / f"process-{i}.log", "wb")  # noqa: SIM115 - the child keeps it
            procs.append(
                subprocess.Popen(
                    ["bash", "-c", ready + "exec " + line.split("#")[0]],
                    cwd=tmp_path,
                    env=env,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            )
        schedule_id = shell(ready + schedule).strip()
        wait_for(
            lambda: (
                "succeeded" in shell(f"{ready}duejobs show {schedule_id}")
                or any(p.poll() is not None for p in procs)
            ),
            60,
            "the tutorial's reminder to run",
        )
        assert [p.poll() for p in procs] == [None, None, None]
        shell(ready + "python - <<'EOF'\nimport reminders\n" + change + "EOF\n")
    finally:
        for proc in procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in procs:
            proc.wait(timeout=60)
        servers.drop_database(database)
    assert "reminding ana (attempt 1)" in (tmp_path / "process-1.log").read_text()


def test_the_readmes_first_delayed_job_runs_as_written(tmp_path: Path) -> None:
    """The README's quick start as a newcomer types it on a machine with only Python: its
    install line, ``reminders.py`` saved in a new folder, ``duejobs dev`` (no URLs: the
    embedded servers, started and migrated), and once dev has said it serves, the second
    shell's ``duejobs schedule`` — until dev prints the reminder. How long that took after
    the install finished is printed (``-s``; ten seconds of it are the job's own delay).
    Seen failing with the schedule line's task name misspelt in the README."""
    readme = (ROOT / "README.md").read_text()
    install = next(line for line in install_lines() if line.page == "README.md")
    module = re.search(r"```python\n(# reminders\.py\n.*?)```", readme, re.S)
    dev = re.search(r"^(duejobs dev .*?)\s+#", readme, re.M)
    schedule = re.search(r"^(duejobs schedule .*)$", readme, re.M)
    assert module and dev and schedule, "the README's quick start is not where it was"
    bin_ = new_venv(tmp_path / "venv")
    run_in(bin_, install.shell, ROOT)
    installed = time.monotonic()
    folder = tmp_path / "project"
    folder.mkdir()
    (folder / "reminders.py").write_text(module.group(1))
    env = {k: v for k, v in in_venv(bin_).items() if not k.startswith("DUEJOBS_")}
    log = tmp_path / "dev.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            ["bash", "-c", "exec " + dev.group(1)],
            cwd=folder,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        wait_for(
            lambda: "duejobs dev:" in log.read_text() or proc.poll() is not None,
            120,
            "duejobs dev to say it serves",
        )
        done = subprocess.run(
            ["bash", "-c", schedule.group(1)],
            cwd=folder,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 0, done.stdout + done.stderr
        wait_for(
            lambda: "reminding ana (attempt 1)" in log.read_text() or proc.poll() is not None,
            60,
            "dev to print the reminder",
        )
        assert proc.poll() is None, log.read_text()
        print(f"first delayed job {time.monotonic() - installed:.1f} s after the install")
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGINT)
        proc.wait(timeout=60)


def _image_install(app_dir: Path) -> str:
    """The Dockerfile's COPY lines done into ``app_dir``; its RUN line's ``pip install``."""
    dockerfile = (ROOT / "Dockerfile").read_text()
    app_dir.mkdir()
    for sources in re.findall(r"^COPY (.+)$", dockerfile, re.M):
        *names, target = sources.split()
        for name in names:
            source, dest = ROOT / name, app_dir / (name if target.endswith("/") else target)
            if source.is_dir():
                shutil.copytree(source, dest, ignore=shutil.ignore_patterns("__pycache__"))
            else:
                shutil.copy(source, dest)
    run = re.search(r"^RUN (.+)$", dockerfile, re.M)
    assert run is not None, "the Dockerfile installs nothing"
    return next(p.strip() for p in run.group(1).split("&&") if p.strip().startswith("pip "))


def _command(service: dict[str, Any]) -> str:
    """A compose service's command as a shell runs it here: the image's entrypoint
    (``duejobs``) before it, ``${VAR:-default}`` at its default, each metrics port a free one
    (a worker's processes take the ports after its own)."""
    entrypoint = service.get("entrypoint", ["duejobs"])
    words = [_defaulted(w) for w in [*entrypoint, *service["command"]]]
    for i, word in enumerate(words[:-1]):
        if word == "--metrics-port":
            words[i + 1] = str(_free_ports(4))
    if entrypoint[:2] == ["sh", "-c"]:
        return words[-1]
    return " ".join(_quoted(w) for w in words)


def _defaulted(word: str) -> str:
    return re.sub(r"\$\{[A-Z_]+:-([^}]*)\}", r"\1", word)


def _quoted(word: str) -> str:
    return word if re.fullmatch(r"[\w.,:/=-]+", word) else "'" + word.replace("'", "'\\''") + "'"


def _free_ports(n: int) -> int:
    """The first of ``n`` consecutive ports free now."""
    for _ in range(100):
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            first = probe.getsockname()[1]
        if first + n < 65536 and all(_free(first + i) for i in range(1, n)):
            return int(first)
    raise AssertionError("no run of free ports found")


def _free(port: int) -> bool:
    with socket.socket() as probe:
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def _succeeded(database_url: str) -> int:
    with psycopg.connect(libpq_url(database_url)) as conn:
        row = conn.execute(
            "SELECT count(*) FROM scheduled_jobs WHERE type = 'send-reminder' "
            "AND status = 'succeeded'"
        ).fetchone()
    return int(row[0]) if row else 0


def _logs(tmp_path: Path, names: dict[str, int | None]) -> str:
    return "\n".join(
        f"--- {name} exited {code}:\n{(tmp_path / f'{name}.log').read_text()[-3000:]}"
        for name, code in names.items()
    )
