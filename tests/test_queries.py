"""The store's statements: every one named in ``duejobs/store/sql/``, whole as PostgreSQL
receives it, loaded once, each used, each parsed by the server in both schema modes.

Seen failing against a build broken on purpose: a statement left in a module as a string
(``conn.execute(text(...))`` in ``store/retention.py``)
→ ``test_the_store_runs_every_statement_by_name``; a query no code runs
→ ``test_every_named_query_is_run_by_the_store``; ``/*schema*/`` left out before one
``scheduled_jobs`` of ``claim_walk``
→ ``test_every_table_of_duejobs_is_named_after_the_schema_mark``; one job id spelled
``'-a' || s.attempts`` in ``window_page`` →
``test_each_shared_rule_is_spelled_alike_wherever_a_statement_spells_it`` (and one part of a
list's filter dropped in ``list_schedules_latest_first``); a column misspelt
in ``list_schedules`` → ``test_every_named_statement_parses_in_both_schema_modes``.
"""

from __future__ import annotations

import re
import secrets
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import psycopg
import pytest
from sqlalchemy import text

from duejobs import App
from duejobs.models import EventKind
from duejobs.store.partitions import Partitioning
from duejobs.store.queries import (
    PARTITIONED_MODE_TABLES,
    QUERIES,
    SCHEMA_MARK,
    TABLES,
    in_schema,
    parse,
)

STORE = Path(__file__).resolve().parent.parent / "duejobs" / "store"


def _code(sql: str) -> str:
    """A statement without its string literals and with its whitespace made single."""
    return re.sub(r"\s+", " ", re.sub(r"'[^']*'", "''", sql))


def test_every_query_is_whole_sql_with_its_parameters_bound() -> None:
    assert len(QUERIES) >= 50
    for name, query in QUERIES.items():
        assert "{{" not in query.sql and "}}" not in query.sql, name
        assert query.sql.strip() and not query.sql.lstrip().startswith("--"), name
        unbound = re.search(r"(?<![:\w]):\w", re.sub(r"'[^']*'", "", query.driver_sql))
        assert unbound is None, name  # every :name became a psycopg parameter


def test_every_table_of_duejobs_is_named_after_the_schema_mark() -> None:
    """A table named without the mark would be read in the connection's search path, not in
    the App's schema."""
    unmarked = re.compile(r"(?<![.\w/])(" + "|".join(TABLES) + r")\b")
    offending = [
        f"{name}: {found[0]}"
        for name, query in QUERIES.items()
        for found in unmarked.finditer(_code(query.sql).replace(SCHEMA_MARK, "/"))
    ]
    assert offending == []
    acme = in_schema("acme")
    assert all(SCHEMA_MARK not in q.sql and SCHEMA_MARK not in q.driver_sql for q in acme.values())
    assert "acme.scheduled_jobs" in acme["claim_walk"].driver_sql


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


# Rules several statements spell, each as every statement must spell it: (what shows a
# statement spells the rule, the rule whole, ``\w+`` standing for a table's alias).
RULES = {
    "the job id": (
        "'dj-' ||",
        r"'dj-' \|\| replace\((\w+)\.tenant, '\.', '_'\) \|\| '-' \|\| "
        r"replace\(CAST\(\1\.id AS text\), '-', ''\) \|\| '-v' \|\| \1\.version \|\| '-a' \|\| "
        r"\(\1\.attempts \+ 1\)",
    ),
    "the skip verdict": (
        "THEN 'superseded'",
        r"CASE WHEN status = 'cancelled' THEN 'cancelled' WHEN version <> :version THEN "
        r"'superseded' WHEN status <> :current_status OR attempts <> :current_attempts THEN "
        r"'duplicate' END",
    ),
    "the default quota": (
        "tenant_quotas WHERE tenant = '*'",
        r"COALESCE\(\(SELECT (\w+) FROM /\*schema\*/tenant_quotas WHERE tenant = ([\w.:]+)\), "
        r"\(SELECT \1 FROM /\*schema\*/tenant_quotas WHERE tenant = '\*'\)\)",
    ),
    "the run_at of a request": (
        "CAST(:delay AS interval)",
        r"COALESCE\(CAST\(:run_at AS timestamptz\), statement_timestamp\(\) \+ "
        r"CAST\(:delay AS interval\)\)",
    ),
    "a list's filter": (
        "CAST(:recurring_ids AS uuid[]) IS NULL",
        r"AND \(CAST\(:tenant AS text\) IS NULL OR tenant = :tenant\) "
        r"AND \(CAST\(:statuses AS text\[\]\) IS NULL OR status = ANY\(:statuses\)\) "
        r"AND \(CAST\(:type AS text\) IS NULL OR type = :type\) "
        r"AND \(CAST\(:key AS text\) IS NULL OR key = :key\) "
        r"AND \(CAST\(:queue AS text\) IS NULL OR queue = :queue\) "
        r"AND \(CAST\(:due_from AS timestamptz\) IS NULL OR due_at >= :due_from\) "
        r"AND \(CAST\(:due_before AS timestamptz\) IS NULL OR due_at < :due_before\) "
        r"AND \(CAST\(:recurring_ids AS uuid\[\]\) IS NULL "
        r"OR recurring_id = ANY\(:recurring_ids\)\) "
        r"AND \(CAST\(:after_due AS timestamptz\) IS NULL "
        r"OR \(due_at, id\) [<>] \(:after_due, :after_id\)\)",
    ),
    "an instant in a history detail": (
        "AT TIME ZONE 'UTC'",
        r"\(to_jsonb\(CAST\((.+?) AS timestamptz\) AT TIME ZONE 'UTC'\) #>> '\{\}'\) "
        r"\|\| '\+00:00'",
    ),
}


@pytest.mark.parametrize("rule", RULES)
def test_each_shared_rule_is_spelled_alike_wherever_a_statement_spells_it(rule: str) -> None:
    shows, whole = RULES[rule]
    spelling = re.compile(whole.replace(" ", r"\s*"))
    users = [q for q in QUERIES.values() if shows in re.sub(r"\s+", " ", q.sql)]
    assert len(users) >= 2, f"{rule}: spelled by {len(users)} statement"
    for query in users:
        flat = re.sub(r"\s+", " ", query.sql)
        assert flat.count(shows) == len(spelling.findall(flat)), f"{rule} in {query.name}"


def test_the_figures_count_every_kind_of_event() -> None:
    counted = set(re.findall(r"FILTER \(WHERE kind = '(\w+)'\) AS (\w+)", QUERIES["activity"].sql))
    assert {(k.value, k.value) for k in EventKind} <= counted


@pytest.mark.parametrize(
    ("text", "error"),
    [
        ("-- name: a\nSELECT 1\n-- name: a\nSELECT 2\n", "appears twice"),
        ("SELECT 1\n-- name: a\nSELECT 2\n", "before the first"),
        ("-- name: a\n-- only a comment\n", "is empty"),
    ],
)
def test_a_malformed_query_file_is_refused_when_loaded(text: str, error: str) -> None:
    with pytest.raises(ValueError, match=error):
        parse(text, "bad.sql")


@pytest.fixture(params=["plain", "partitioned"])
def schema_app(request: pytest.FixtureRequest, database_url: str, redis_url: str) -> Iterator[App]:
    """An App on tables of a schema of their own, in each schema mode."""
    schema = f"{request.param}_{secrets.token_hex(4)}"
    app = App(database_url=database_url, redis_url=redis_url, schema=schema)
    app.migrate(
        partitioned=Partitioning(timedelta(days=1), 2) if request.param == "partitioned" else None
    )
    yield app
    with app.engine.begin() as conn:
        conn.execute(text(f"DROP SCHEMA {schema} CASCADE"))
    app.close()


def test_every_named_statement_parses_in_both_schema_modes(schema_app: App) -> None:
    """Each statement, its tables in the App's schema, PREPAREd by the server (parsed,
    analysed, planned for its parameters' types, run for none); one PREPARE does not take (a
    CREATE, a TRUNCATE) runs in a savepoint rolled back. On the plain schema, the statements
    of partitioned mode's own tables are left to the partitioned run."""
    schema = schema_app.core.settings.schema
    partitioned = schema.startswith("partitioned")
    only_partitioned = re.compile(r"/\*schema\*/(" + "|".join(PARTITIONED_MODE_TABLES) + r")\b")
    refused = []
    with schema_app.engine.connect() as outer:
        conn = outer.connection.driver_connection
        assert isinstance(conn, psycopg.Connection)
        with conn.transaction(force_rollback=True):
            conn.execute(in_schema(schema)["create_staging"].driver_sql)
            for name, query in QUERIES.items():
                if not partitioned and only_partitioned.search(query.sql):
                    continue
                sql = _numbered(in_schema(schema)[name].driver_sql)
                preparable = re.match(r"\s*(SELECT|INSERT|UPDATE|DELETE|WITH)\b", sql)
                try:
                    with conn.transaction(force_rollback=True):
                        conn.execute(f"PREPARE q AS {sql}" if preparable else sql)
                except psycopg.errors.DuplicateTable:
                    assert partitioned  # its own tables' CREATE, on a schema that has them
                except psycopg.Error as exc:
                    refused.append(f"{name}: {str(exc).splitlines()[0]}")
                conn.execute("DEALLOCATE ALL")
    assert refused == [], "\n".join(refused)


def _numbered(driver_sql: str) -> str:
    """A statement's ``%(name)s`` parameters as PREPARE takes them: ``$1``, ``$2``, ..."""
    numbers: dict[str, int] = {}

    def number(match: re.Match[str]) -> str:
        return f"${numbers.setdefault(match[1], len(numbers) + 1)}"

    return re.sub(r"%\((\w+)\)s", number, driver_sql).replace("%%", "%")


def test_functions_and_triggers_are_written_in_sql_files() -> None:
    """Partitioned mode's PL/pgSQL and triggers live in ``store/sql/ddl/``, where only their
    identifiers are filled in; no Python string holds a function's or a trigger's body. Seen
    failing on the build before (``store/partition_keys.py``, ``store/conversion.py``)."""
    offending = [
        str(path.relative_to(STORE.parent))
        for path in STORE.parent.rglob("*.py")
        if re.search(r"CREATE (OR REPLACE )?(FUNCTION|TRIGGER)|plpgsql", path.read_text())
    ]
    assert offending == []
