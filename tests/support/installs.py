"""The install lines a reader of the README and docs/ runs, and new virtualenvs to run them in
(``make test-install``, part of ``make test-all``)."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from tests.support.processes import ROOT

PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
# A checkout's path, as the pages spell it until the package is published.
CHECKOUT = "path/to/duejobs"
_FENCED = re.compile(r"```[a-z]*\n(.*?)```", re.S)
_INLINE = re.compile(r"`(pip install [^`]+)`")
# A command given in a fenced block's comment ("# or build the wheel ...:  make dist && ...").
_IN_COMMENT = re.compile(r"#[^:]*:\s+((?:make dist && )?pip install .+)$")
_COMMAND = re.compile(r"^\s*((?:make dist && )?pip install .+?)(?:\s+#.*)?$")
_EXTRAS = re.compile(r"\[([a-z0-9_,-]+)\]")


@dataclass(frozen=True)
class InstallLine:
    """One install command a page gives, as a reader would type it."""

    page: str
    command: str

    def __str__(self) -> str:
        return f"{self.page}: {self.command}"

    @property
    def extras(self) -> list[str]:
        """The extras of duejobs it asks for."""
        found = _EXTRAS.search(self.command)
        return found.group(1).split(",") if found else []

    @property
    def shell(self) -> str:
        """The command as run here: a checkout's path is this checkout."""
        return self.command.replace(CHECKOUT, str(ROOT))


def install_lines() -> list[InstallLine]:
    """Every ``pip install`` a page gives — a fenced line, one in a fenced line's comment, or
    inline code — but the one for once the package is published (``duejobs[...]`` by name,
    which tests/test_packaging.py keeps to the README's "Once published")."""
    lines: list[InstallLine] = []
    for page in PAGES:
        text, name = page.read_text(), str(page.relative_to(ROOT))
        for block in _FENCED.findall(text):
            for line in block.splitlines():
                found = _COMMAND.match(line) or _IN_COMMENT.search(line)
                if found:
                    lines.append(InstallLine(name, found.group(1).strip()))
        for inline in _INLINE.findall(_FENCED.sub("", text)):
            if not re.match(r"""pip install ['"]?duejobs\b""", inline):
                lines.append(InstallLine(name, inline.strip()))
    return lines


def new_venv(path: Path) -> Path:
    """A new virtualenv at ``path``, pip upgraded; its ``bin`` folder."""
    subprocess.run([sys.executable, "-m", "venv", str(path)], check=True, timeout=120)
    bin_ = path / "bin"
    subprocess.run(
        [str(bin_ / "python"), "-m", "pip", "install", "--quiet", "--upgrade", "pip"],
        check=True,
        timeout=300,
    )
    return bin_


def in_venv(bin_: Path) -> dict[str, str]:
    """The environment of a shell in which ``bin_``'s virtualenv is active."""
    env = {k: v for k, v in os.environ.items() if k not in {"PYTHONPATH", "PYTHONHOME"}}
    env["VIRTUAL_ENV"] = str(bin_.parent)
    env["PATH"] = f"{bin_}{os.pathsep}{env.get('PATH', '')}"
    return env


def run_in(
    bin_: Path, command: str, cwd: Path, timeout: float = 900, env: dict[str, str] | None = None
) -> str:
    """``command`` run by a shell in ``bin_``'s virtualenv from ``cwd`` (with ``env`` added);
    its output, or an assertion naming it with its output."""
    done = subprocess.run(
        ["bash", "-c", command],
        cwd=cwd,
        env={**in_venv(bin_), **(env or {})},
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert done.returncode == 0, (
        f"{command!r} exited {done.returncode}:\n{done.stdout}{done.stderr}"
    )
    return done.stdout


def missing_requirements(bin_: Path, extras: list[str]) -> list[str]:
    """The requirements of duejobs and of its ``extras`` that the virtualenv lacks."""
    code = (
        "import sys\n"
        "from importlib.metadata import distribution, PackageNotFoundError\n"
        "from packaging.requirements import Requirement\n"
        "extras = set(sys.argv[1:])\n"
        "for text in distribution('duejobs').requires or []:\n"
        "    r = Requirement(text)\n"
        "    if r.marker and not any(r.marker.evaluate({'extra': e}) for e in extras):\n"
        "        continue\n"
        "    try:\n"
        "        distribution(r.name)\n"
        "    except PackageNotFoundError:\n"
        "        print(r.name)\n"
    )
    packaging = subprocess.run(
        [str(bin_ / "python"), "-m", "pip", "install", "--quiet", "packaging"],
        capture_output=True,
        timeout=300,
    )
    assert packaging.returncode == 0, packaging.stderr
    out = run_in(bin_, shlex.join([str(bin_ / "python"), "-c", code, *extras]), ROOT, 120)
    return out.split()
