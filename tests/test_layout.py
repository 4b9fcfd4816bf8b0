"""The layout's promises, checked on the source: each boundary has one module behind it.

* only the store speaks SQL: SQLAlchemy's SQL constructs (``text``, ``select``, ...,
  ``sqlalchemy.sql``) and psycopg are imported by the ``duejobs/store/`` package alone
  (connections, engines and error classes may be named anywhere);
* only RQ's wire code knows RQ: ``rq`` is imported by the ``duejobs/rq_wire/`` package alone,
  which imports nothing of duejobs' but the records it carries, the defaults and itself (the
  push policy in ``delivery/`` and the worker's loop are built on it);
* RQ is read and written through its public names: no class subclasses one of RQ's, and no
  private RQ name (``_state``, ``Job._execute``...) is imported, read or written;
* the App is a facade: no module imports ``duejobs.app.application`` but the public package and the
CLI
  (the services take the :class:`~duejobs.core.Core` an App hands them);
* tests use public or explicitly exported names of the store: no ``store._...``; no test
  module imports another or ``tests/conftest.py`` (what tests share is in ``tests/support/``);
* no module is over 500 lines: a module that grows past it holds more than one role;
* no import cycle inside ``duejobs/``, imports made for type checking included (a cycle is
  one for readers and type checkers even where Python would import it);
* the worker is built on the delivery side and not the reverse: ``duejobs/delivery/``
  imports nothing from ``duejobs/worker/``.

Seen failing against a build broken on purpose: ``from sqlalchemy import text`` in
``duejobs/demo.py`` (as it was) → ``test_only_the_store_speaks_sql``; the worker that
subclassed RQ's (``DuejobsWorker(SimpleWorker)``, ``DeliveryJob(Job)``, ``_state``,
``_status``, ``_ordered_queues``) → ``test_no_class_subclasses_one_of_rqs`` and
``test_no_private_rq_name_is_read_or_written``; ``from rq import Queue`` back in
``delivery/deliverer.py`` → ``test_only_rqs_wire_code_knows_rq``; ``from
duejobs.delivery.nodes import Node`` in ``rq_wire/keys.py`` →
``test_rqs_wire_format_is_built_on_nothing_above_it``.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "duejobs"
SQL_CONSTRUCTS = {
    "text",
    "select",
    "insert",
    "update",
    "delete",
    "func",
    "literal",
    "literal_column",
    "bindparam",
    "column",
    "table",
    "TextClause",
    "and_",
    "or_",
}


def _imports(path: Path) -> list[tuple[str, str | None]]:
    """(module, name) for every import in a file, relative ones made absolute; name is None
    for ``import module``."""
    found: list[tuple[str, str | None]] = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(alias.name, None) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            module = node.module or ""
            if node.level:  # from . (this file's package) or .. (its parent) ...
                package = _module_name(path).split(".")
                if path.name != "__init__.py":
                    package = package[:-1]
                package = package[: len(package) - node.level + 1]
                module = ".".join(package + ([module] if module else []))
            found += [(module, alias.name) for alias in node.names]
    return found


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _package_modules() -> dict[str, Path]:
    return {_module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def _import_graph() -> dict[str, set[str]]:
    """Each module of the package and the modules of the package it imports: ``from a
    import b`` names the module ``a.b`` when there is one, else ``a``."""
    modules = _package_modules()
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        targets = set()
        for module, imported in _imports(path):
            if f"{module}.{imported}" in modules:
                targets.add(f"{module}.{imported}")
            elif module in modules:
                targets.add(module)
        graph[name] = targets - {name}
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in sorted(graph[node]):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def _relative(path: Path) -> str:
    return str(path.relative_to(PACKAGE))


def _modules() -> list[Path]:
    """The package's modules outside the store."""
    return sorted(p for p in PACKAGE.rglob("*.py") if "store" not in p.relative_to(PACKAGE).parts)


def _rq_modules() -> list[Path]:
    """The package's modules that import RQ."""
    return [p for p in _modules() if any(m.split(".")[0] == "rq" for m, _n in _imports(p))]


def _private(name: str | None) -> bool:
    return bool(name) and name.startswith("_") and not name.startswith("__")  # type: ignore[union-attr]


def _speaks_sql(module: str, name: str | None) -> bool:
    top = module.split(".")[0]
    if top == "psycopg":
        return True
    if module.startswith("sqlalchemy.sql"):
        return True
    return module == "sqlalchemy" and name in SQL_CONSTRUCTS


@pytest.mark.parametrize("path", _modules(), ids=_relative)
def test_only_the_store_speaks_sql(path: Path) -> None:
    offending = [f"{m}.{n}" if n else m for m, n in _imports(path) if _speaks_sql(m, n)]
    assert offending == [], f"{path.name} imports {offending}: SQL belongs in duejobs/store/"


@pytest.mark.parametrize("path", _modules(), ids=_relative)
def test_only_rqs_wire_code_knows_rq(path: Path) -> None:
    if path.parent == PACKAGE / "rq_wire":
        return
    offending = [m for m, _n in _imports(path) if m.split(".")[0] == "rq"]
    assert offending == [], f"{path.name} imports {offending}: RQ belongs in duejobs/rq_wire/"


# What RQ's wire format may import of duejobs: the records it carries, the defaults (and the
# Redis URLs they read, with what a failed call raises), the lazy exports of its package, and
# itself.
_BELOW_RQ_WIRE = (
    *("duejobs.models", "duejobs.config", "duejobs.redis_urls", "duejobs.lazy"),
    "duejobs.rq_wire",
)


@pytest.mark.parametrize("path", sorted((PACKAGE / "rq_wire").glob("*.py")), ids=_relative)
def test_rqs_wire_format_is_built_on_nothing_above_it(path: Path) -> None:
    """The delivery side and the worker import the wire format; an import back up from it is
    a cycle in waiting, and a key's name spelled where a cluster's change would miss it."""
    ours = [m for m, _n in _imports(path) if m.split(".")[0] == "duejobs"]
    offending = [m for m in ours if not m.startswith(_BELOW_RQ_WIRE)]
    assert offending == [], f"{path.name} imports {offending}: the wire format sits below them"


@pytest.mark.parametrize("path", _rq_modules(), ids=_relative)
def test_no_class_subclasses_one_of_rqs(path: Path) -> None:
    from_rq = {n for m, n in _imports(path) if m.split(".")[0] == "rq" and n}
    modules = {m.split(".")[-1] for m, n in _imports(path) if m.split(".")[0] == "rq" and not n}
    offending = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ClassDef):
            for base in node.bases:
                named = ast.unparse(base)
                if named in from_rq or named.split(".")[0] in modules | {"rq"}:
                    offending.append(f"{node.name}({named})")
    assert offending == [], f"{path.name}: {offending} subclass RQ's classes"


@pytest.mark.parametrize("path", _rq_modules(), ids=_relative)
def test_no_private_rq_name_is_read_or_written(path: Path) -> None:
    """In a module that knows RQ, no name starting with one underscore is imported from RQ
    or reached on anything but the module's own objects (``self``, ``cls``)."""
    offending = [
        f"import {n}" for m, n in _imports(path) if m.split(".")[0] == "rq" and _private(n)
    ]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Attribute) and _private(node.attr):
            owner = node.value
            if not (isinstance(owner, ast.Name) and owner.id in ("self", "cls")):
                offending.append(f"{ast.unparse(node)} (line {node.lineno})")
    assert offending == [], f"{path.name} reaches private names: {offending}"


@pytest.mark.parametrize("path", _modules(), ids=_relative)
def test_only_the_public_package_the_cli_and_the_integrations_import_the_app(
    path: Path,
) -> None:
    inside = PACKAGE / "app" in path.parents or path == PACKAGE / "__init__.py"
    if inside or path.parent.name == "cli" or PACKAGE / "contrib" in path.parents:
        return
    offending = [m for m, _n in _imports(path) if m.split(".")[:2] == ["duejobs", "app"]]
    assert offending == [], f"{_relative(path)} imports the App: services take its Core"


@pytest.mark.parametrize(
    "path", sorted((ROOT / "tests").rglob("*.py")), ids=lambda p: str(p.relative_to(ROOT))
)
def test_no_test_module_imports_another_or_the_conftest(path: Path) -> None:
    """What tests share lives in ``tests/support/``: a test module or ``tests/conftest.py``
    imported as a library ties tests together by their files."""
    offending = [
        f"{m}.{n}" if m == "tests" else m
        for m, n in _imports(path)
        if m in ("tests.conftest", "conftest")
        or m.startswith("tests.test_")
        or (m == "tests" and str(n).startswith(("test_", "conftest")))
    ]
    assert offending == [], f"{path.name} imports {offending}: move what it needs to tests/support"


def test_tests_use_no_private_name_of_the_store() -> None:
    offending = []
    for path in sorted((ROOT / "tests").glob("*.py")):
        tree = ast.parse(path.read_text(), str(path))
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Attribute)
                and isinstance(node.value, ast.Name)
                and node.value.id == "store"
                and node.attr.startswith("_")
            ):
                offending.append(f"{path.name}:{node.lineno} store.{node.attr}")
    assert offending == []


@pytest.mark.parametrize("path", sorted(PACKAGE.rglob("*.py")), ids=_relative)
def test_no_module_is_over_500_lines(path: Path) -> None:
    lines = len(path.read_text().splitlines())
    assert lines <= 500, f"{path.relative_to(ROOT)} has {lines} lines: split it by role"


def test_there_is_no_import_cycle_inside_the_package() -> None:
    assert _cycles(_import_graph()) == []


def test_the_import_graph_sees_a_cycle_made_on_purpose() -> None:
    """The check above, held against a graph with a cycle of three."""
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert _cycles(graph) == [["a", "b", "c"]]


@pytest.mark.parametrize("path", sorted((PACKAGE / "delivery").glob("*.py")), ids=_relative)
def test_delivery_imports_nothing_from_the_worker(path: Path) -> None:
    offending = [m for m, _n in _imports(path) if m.startswith("duejobs.worker")]
    assert offending == [], f"{path.name} imports {offending}: the worker builds on delivery"


# What the observability package sits below: the App's core and everything built on it.
_ABOVE_OBSERVABILITY = (
    "duejobs.core",
    "duejobs.app",
    "duejobs.services",
    "duejobs.scheduler",
    "duejobs.worker",
    "duejobs.cli",
    "duejobs.dashboard",
    "duejobs.contrib",
)


@pytest.mark.parametrize("path", sorted((PACKAGE / "observability").glob("*.py")), ids=_relative)
def test_observability_imports_nothing_built_on_it(path: Path) -> None:
    """The core imports observability (tracing, the replica's reads): an import back up from it
    is a cycle in waiting. Figures that read the services live with them (services/stats.py)."""
    offending = [m for m, _n in _imports(path) if m.startswith(_ABOVE_OBSERVABILITY)]
    assert offending == [], f"{path.name} imports {offending}: they build on observability"


def test_the_package_root_holds_at_most_fifteen_modules() -> None:
    root = sorted(p.name for p in PACKAGE.glob("*.py"))
    assert len(root) <= 15, f"{len(root)} modules at the package root: {root}"
