"""The store's statements: every one named in ``duejobs/store/sql/``, loaded once, each used.

Seen failing against a build broken on purpose: a statement left in a module as a string
(``conn.execute(text(...))`` in ``store/retention.py``)
→ ``test_the_store_runs_every_statement_by_name``; a query no code runs
→ ``test_every_named_query_is_run_by_the_store``.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from duejobs.store.queries import FRAGMENTS, QUERIES, parse

STORE = Path(__file__).resolve().parent.parent / "duejobs" / "store"


def test_every_query_is_complete_sql_with_its_fragments_expanded() -> None:
    assert len(QUERIES) >= 50
    for name, query in QUERIES.items():
        assert "{{" not in query.sql and "}}" not in query.sql, name
        assert query.sql.strip() and not query.sql.lstrip().startswith("--"), name
        unbound = re.search(r"(?<![:\w]):\w", re.sub(r"'[^']*'", "", query.driver_sql))
        assert unbound is None, name  # every :name became a psycopg parameter


def test_every_named_query_is_run_by_the_store() -> None:
    code = "\n".join(p.read_text() for p in STORE.glob("*.py"))
    unused = [name for name in QUERIES if f'"{name}"' not in code]
    assert unused == []


def test_the_store_runs_every_statement_by_name() -> None:
    offending = []
    for path in sorted(STORE.glob("*.py")):
        # The one path to PostgreSQL, the caller's connection it runs on, and the setup of a
        # new connection (which runs the named query backend_pid on the driver's own).
        if path.name in ("execution.py", "lent.py", "connecting.py"):
            continue
        for pattern in (r"\btext\(", r"\.execute\(", r"exec_driver_sql\(", r"\.cursor\("):
            if re.search(pattern, path.read_text()):
                offending.append(f"{path.name}: {pattern}")
    assert offending == []


@pytest.mark.parametrize(
    ("rule", "spelled"),
    [
        ("quota", "FROM tenant_quotas WHERE tenant = '*'"),
        ("job_id", "'dj-' ||"),
        ("skip_verdict", "THEN 'superseded'"),
        ("created_detail", "'key', key, 'due_at'"),
        ("run_at", "statement_timestamp() + CAST(:delay AS interval)"),
    ],
)
def test_each_shared_rule_is_spelled_in_its_fragment_only(rule: str, spelled: str) -> None:
    written = "\n".join(p.read_text() for p in (STORE / "sql").glob("*.sql"))
    assert spelled in FRAGMENTS[rule] and spelled not in written
    assert any(spelled in q.sql for q in QUERIES.values())  # and the queries do use it


@pytest.mark.parametrize(
    ("text", "error"),
    [
        ("-- name: a\nSELECT 1\n-- name: a\nSELECT 2\n", "appears twice"),
        ("-- name: a\nSELECT {{nowhere}}\n", "unknown fragment"),
        ("SELECT 1\n-- name: a\nSELECT 2\n", "before the first"),
        ("-- name: a\n-- only a comment\n", "is empty"),
        ("-- name: a\nSELECT {{utc(a, b)}}\n", "takes 1 arguments"),
        ("-- name: a\nSELECT {{utc(f(g(x)))}}\n", "left unexpanded"),
    ],
)
def test_a_malformed_query_file_is_refused_when_loaded(text: str, error: str) -> None:
    with pytest.raises(ValueError, match=error):
        parse(text, "bad.sql")


def test_a_fragment_can_take_arguments_and_use_another() -> None:
    [query] = parse(
        "-- name: q\nSELECT 1 FROM t s WHERE {{tenant_due(s, :t, NULL)}}\n", "x"
    ).values()
    assert "(s.tenant, s.due_at) <= (:t, statement_timestamp()" in query.sql
    assert "%(t)s" in query.driver_sql and "%(window)s" in query.driver_sql
