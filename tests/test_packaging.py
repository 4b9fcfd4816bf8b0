"""What a team installs: ``pip install duejobs`` with no extras is a working library and CLI
against given URLs; the version is the distribution's; frameworks, test tools and psycopg's
wheel stay optional.

Seen failing against a build broken on purpose: ``psycopg[binary]`` back among the runtime
requirements → ``test_runtime_requirements_leave_out_frameworks_tools_and_psycopgs_wheel``;
the CLI importing Django at startup →
``test_a_plain_install_is_a_working_library_and_cli_against_given_urls``.
"""

from __future__ import annotations

import ctypes.util
import importlib.metadata
import importlib.util
import os
import re
import subprocess
import sys
import tomllib
import uuid
from collections import Counter
from pathlib import Path

import pytest
from packaging.requirements import Requirement

import duejobs
from tests.support.installs import PAGES, install_lines
from tests.support.processes import ROOT
from tests.support.servers import Servers


def test_the_version_is_the_installed_distributions() -> None:
    installed = importlib.metadata.version("duejobs")
    shown = subprocess.run(
        [sys.executable, "-m", "duejobs", "--version"], capture_output=True, text=True, check=True
    )
    assert shown.stdout.strip() == f"duejobs, version {installed}"
    assert duejobs.__version__ == installed


def test_every_package_of_the_source_is_shipped() -> None:
    """Seen failing when ``duejobs/worker/`` was added without being listed: the wheel had no
    worker, and only an install from it showed it."""
    listed = set(
        tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]
    )
    found = {
        ".".join(p.parent.relative_to(ROOT).parts) for p in (ROOT / "duejobs").rglob("__init__.py")
    }
    assert found - listed == set()


def test_every_folder_of_files_in_the_package_is_listed_as_one_of_its_packages() -> None:
    """Its SQL and its templates too, each folder a package with its files as its data: a
    folder left out is one setuptools warns of at every build ("Package would be ignored").
    Seen failing with ``store/sql``, ``store/sql/ddl`` and ``dashboard/templates`` shipped as
    data of their parents."""
    listed = set(
        tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]
    )
    folders = {
        ".".join(p.parent.relative_to(ROOT).parts)
        for p in (ROOT / "duejobs").rglob("*")
        if p.is_file() and "__pycache__" not in p.parts
    }
    assert folders - listed == set()


def test_every_extra_the_docs_install_exists() -> None:
    """Each ``duejobs[...]`` or ``.[...]`` the README and docs/ tell a reader to install names
    extras the package has. Seen failing with ``[fastapi]``, which the FastAPI example needs
    and no extra provided."""
    extras = set(
        tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    )
    pages = [ROOT / "README.md", *(ROOT / "docs").glob("*.md")]
    named = {
        (page.name, extra.strip())
        for page in pages
        for group in re.findall(r"(?:duejobs|\.)\[([a-z0-9_,\s-]+)\]", page.read_text())
        for extra in group.split(",")
    }
    assert {(page, extra) for page, extra in named if extra not in extras} == set()
    assert ("fastapi.md", "fastapi") in named


def test_no_page_installs_duejobs_by_a_name_not_published_yet() -> None:
    """Until the package is on PyPI, ``pip install "duejobs[...]"`` fails: every install line
    of the README and docs/ names a checkout (``path/to/duejobs[...]``, ``.[...]``) or the
    wheel it builds, but for the README's "once published". Seen failing on six pages."""
    bare = re.compile(r"""pip install ['"]?duejobs[\[\s'"]""")
    lines = [
        f"{page.name}: {line.strip()}"
        for page in [ROOT / "README.md", *(ROOT / "docs").glob("*.md")]
        for line in page.read_text().splitlines()
        if bare.search(line) and "nce published" not in line
    ]
    assert lines == []


def test_make_test_install_runs_every_install_line_the_pages_give() -> None:
    """Each ``pip install`` of duejobs a page gives (a checkout's path, ``.``, or the wheel
    built), in a fenced block, a fenced block's comment or inline code, is one that
    ``tests/test_install_lines.py`` runs. Seen failing on the README's wheel line, in a
    comment, before comments were read."""
    given = re.compile(r"""pip install ['"]?(?:path/to/duejobs|\.\[|\$\(ls dist)""")
    counted = Counter(
        str(page.relative_to(ROOT)) for page in PAGES for _ in given.finditer(page.read_text())
    )
    assert Counter(line.page for line in install_lines()) == counted
    assert {"README.md", "docs/tutorial.md", "docs/testing.md", "docs/django.md"} <= set(counted)


def test_runtime_requirements_leave_out_frameworks_tools_and_psycopgs_wheel() -> None:
    required = [Requirement(r) for r in importlib.metadata.requires("duejobs") or []]
    always = {r.name.lower(): r for r in required if r.marker is None}
    optional = {"django", "django-tasks", "fastapi", "uvicorn", "pytest", "ruff", "mypy", "rich"}
    assert not optional & set(always), sorted(optional & set(always))
    assert always["psycopg"].extras == set()  # the application chooses how to get libpq
    extras = {str(r.marker) for r in required if r.marker is not None}
    assert 'extra == "binary"' in extras and 'extra == "django"' in extras


@pytest.mark.long  # a virtualenv made and installed, 19 s: make test-long (test-all)
@pytest.mark.slow
def test_a_plain_install_is_a_working_library_and_cli_against_given_urls(
    tmp_path: Path, servers: Servers, redis_url: str
) -> None:
    if ctypes.util.find_library("pq") is None:
        pytest.skip("no system libpq: a plain install needs it (duejobs[binary] brings its own)")
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet"]
    subprocess.run([*pip, str(ROOT)], check=True, timeout=600)

    database = f"duejobs_plain_{uuid.uuid4().hex[:8]}"
    env = {
        **os.environ,
        "DUEJOBS_DATABASE_URL": servers.create_database(database),
        "DUEJOBS_REDIS_URL": redis_url,
    }
    env.pop("PYTHONPATH", None)
    try:

        def run(*args: str) -> str:
            done = subprocess.run(
                args, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=120
            )
            assert done.returncode == 0, done.stdout + done.stderr
            return done.stdout

        run(str(venv / "bin" / "duejobs"), "migrate")
        script = (
            "import sys, duejobs\n"
            "app = duejobs.App()\n"
            "s = app.schedule('mail', {'to': 'a'}, delay=60)\n"
            "print(app.get(s.id).status.value)\n"
            "print(sorted(m for m in sys.modules if m.split('.')[0] in "
            "{'django', 'fastapi', 'pytest', 'psycopg_binary'}))\n"
        )
        assert run(str(venv / "bin" / "python"), "-c", script).split("\n")[:2] == [
            "scheduled",
            "[]",
        ]
        assert "created" in run(str(venv / "bin" / "duejobs"), "stats")
    finally:
        servers.drop_database(database)


@pytest.mark.parametrize(
    "program",
    [
        ["-m", "duejobs", "stats"],
        [
            "-c",
            "import duejobs\ntry:\n    duejobs.App\n"
            "except ImportError as e: print(e); raise SystemExit(2)",
        ],
    ],
    ids=["cli", "library"],
)
def test_psycopg_without_a_libpq_says_how_to_get_one(program: list[str]) -> None:
    """psycopg installed without a libpq (the plain requirement brings none), stood in for by
    asking psycopg for its C build where none is installed: one line naming the extra that
    brings one, status 2, no traceback. Seen failing before psycopg's first import said so:
    psycopg's own error, in a traceback from whichever module imported it first."""
    if importlib.util.find_spec("psycopg_c") is not None:
        pytest.skip("psycopg's C build is installed: no libpq-less psycopg to stand in")
    done = subprocess.run(
        [sys.executable, *program],
        env={**os.environ, "PSYCOPG_IMPL": "c"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    said = (done.stdout + done.stderr).strip()
    assert done.returncode == 2, said
    assert "Traceback" not in said and len(said.splitlines()) == 1, said
    assert 'pip install "duejobs[binary]"' in said and "libpq" in said, said
