"""The layout's promises, checked on the source: each boundary has one module behind it.

* only the store speaks SQL: SQLAlchemy's SQL constructs (``text``, ``select``, ...,
  ``sqlalchemy.sql``) and psycopg are imported by the ``duejobs/store/`` package alone
  (connections, engines and error classes may be named anywhere);
* only the delivery side knows RQ: ``rq`` is imported by the ``duejobs/delivery/`` package
  alone (the RQ worker class included; the worker's ``Runtime`` knows nothing of RQ);
* the App is a facade: no module imports ``duejobs.app`` but the public package and the CLI
  (the services take the :class:`~duejobs.core.Core` an App hands them);
* tests use public or explicitly exported names of the store: no ``store._...``.

Seen failing against a build broken on purpose: ``from sqlalchemy import text`` in
``duejobs/demo.py`` (as it was) → ``test_only_the_store_speaks_sql``.
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
    """(module, name) for every import in a file; name is None for ``import module``."""
    found: list[tuple[str, str | None]] = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(alias.name, None) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            found += [(node.module, alias.name) for alias in node.names]
    return found


def _modules() -> list[Path]:
    """The package's modules outside the store."""
    return sorted(p for p in PACKAGE.rglob("*.py") if "store" not in p.relative_to(PACKAGE).parts)


def _speaks_sql(module: str, name: str | None) -> bool:
    top = module.split(".")[0]
    if top == "psycopg":
        return True
    if module.startswith("sqlalchemy.sql"):
        return True
    return module == "sqlalchemy" and name in SQL_CONSTRUCTS


@pytest.mark.parametrize("path", _modules(), ids=lambda p: p.name)
def test_only_the_store_speaks_sql(path: Path) -> None:
    offending = [f"{m}.{n}" if n else m for m, n in _imports(path) if _speaks_sql(m, n)]
    assert offending == [], f"{path.name} imports {offending}: SQL belongs in duejobs/store/"


@pytest.mark.parametrize("path", _modules(), ids=lambda p: p.name)
def test_only_the_delivery_side_knows_rq(path: Path) -> None:
    if path.parent.name == "delivery":
        return
    offending = [m for m, _n in _imports(path) if m.split(".")[0] == "rq"]
    assert offending == [], f"{path.name} imports {offending}: RQ belongs in duejobs/delivery/"


@pytest.mark.parametrize("path", _modules(), ids=lambda p: p.name)
def test_only_the_public_package_the_cli_and_the_integrations_import_the_app(
    path: Path,
) -> None:
    public = path.parent == PACKAGE and path.name in ("__init__.py", "async_app.py")
    if public or path.parent.name == "cli" or PACKAGE / "contrib" in path.parents:
        return
    offending = [m for m, _n in _imports(path) if m == "duejobs.app"]
    assert offending == [], f"{path.name} imports the App: services take its Core"


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
