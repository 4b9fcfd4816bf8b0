"""Every statement duejobs runs, by name: the ``sql/*.sql`` files beside this module.

A file holds named blocks, grouped by concern (schedules, claims, attempts, ...)::

    -- name: claim_runs
    -- Deliveries turned into running attempts, many in one statement.
    WITH req AS (...) ...

Parameters are written ``:name``; ``{{fragment}}`` stands for one of :data:`FRAGMENTS`, the
few pieces of SQL several statements share, so that each rule is spelled once. The files are
read once, at import; a name seen twice, an unknown fragment or an empty block is an error
then, not at the first call. The name is what a plan test EXPLAINs and what an error names.
"""

from __future__ import annotations

import re
import string
from dataclasses import dataclass
from importlib.resources import files

from duejobs.models import EventKind

DEFAULT_QUOTA_TENANT = "*"  # the tenant_quotas row whose caps apply to every other tenant

# SQL several statements share: each rule written once. A fragment may take arguments
# (``{{quota(max_live, :tenant)}}``), placed at ``{0}``, ``{1}``, ...; it may use others
# (written ``{{{{name(...)}}}}`` inside one that takes arguments, which is formatted).
FRAGMENTS = {
    # a live schedule: the states a key is held in and a quota counts
    "live": "status IN ('scheduled', 'running')",
    # the live schedule of tenant {0} holding key {1}
    "key_holder": (
        "SELECT 1 FROM scheduled_jobs holder WHERE holder.tenant = {0} AND holder.key = {1} "
        "AND holder.{{{{live}}}}"
    ),
    # a schedule that finished more than :age ago (what the pruner may delete)
    "prunable": (
        "status IN ('succeeded', 'failed', 'cancelled') "
        "AND finished_at < statement_timestamp() - CAST(:age AS interval)"
    ),
    # the deletes of the history of the schedules of CTE {0} (events carry no foreign key,
    # migration 0003; in partitioned mode neither do attempts, results and effects)
    "delete_history": (
        "events AS (DELETE FROM scheduled_job_events "
        "WHERE schedule_id = ANY(ARRAY(SELECT id FROM {0}))), "
        "attempts AS (DELETE FROM scheduled_job_attempts "
        "WHERE schedule_id = ANY(ARRAY(SELECT id FROM {0}))), "
        "results AS (DELETE FROM scheduled_job_results "
        "WHERE schedule_id = ANY(ARRAY(SELECT id FROM {0}))), "
        "effects AS (DELETE FROM scheduled_job_effects "
        "WHERE schedule_id = ANY(ARRAY(SELECT id FROM {0})))"
    ),
    # a row the scheduler has yet to push
    "unpushed": "status = 'scheduled' AND queue_job_id IS NULL",
    # a statement for one tenant, or for all when :tenant is NULL
    "tenant_filter": "(CAST(:tenant AS text) IS NULL OR tenant = :tenant)",
    # a schedule's run_at: the instant given, or the database clock plus the delay
    "run_at": (
        "COALESCE(CAST(:run_at AS timestamptz), statement_timestamp() + CAST(:delay AS interval))"
    ),
    "schedule_columns": (
        "id, tenant, type, key, payload, run_at, due_at, timezone, local_run_at, status, "
        "queue_job_id, version, attempts, last_error, created_at, updated_at, started_at, "
        "finished_at, queue"
    ),
    "recurring_columns": (
        "id, tenant, name, type, payload, cron, timezone, dst_gap, dst_overlap, misfire, "
        "grace, status, version, next_run_at, created_at, updated_at, queue, last_error"
    ),
    # A `created` event's detail, from the schedule's new row (every way of creating one).
    # Most schedules have no zone, key or jitter: building just {"run_at": ...} for them
    # costs a third of building every field and stripping the nulls.
    "created_detail": (
        "CASE WHEN timezone IS NULL AND local_run_at IS NULL AND key IS NULL "
        "AND due_at = run_at THEN jsonb_build_object('run_at', {{utc(run_at)}}) "
        "ELSE jsonb_strip_nulls(jsonb_build_object("
        "'run_at', {{utc(run_at)}}, 'timezone', timezone, 'local_run_at', local_run_at, "
        "'key', key, 'due_at', {{utc(CASE WHEN due_at <> run_at THEN due_at END)}})) END"
    ),
    # An instant as a history detail writes it, in UTC whatever the session's time zone (a
    # timestamptz in JSON takes the session's offset): 2031-06-01T07:00:00+00:00; NULL stays
    # NULL.
    "utc": "(to_jsonb(CAST({0} AS timestamptz) AT TIME ZONE 'UTC') #>> '{{}}') || '+00:00'",
    # Why an attempt is not (or no longer) the current one of its schedule, or NULL: for a
    # delivery about to start (:current_status 'scheduled', :current_attempts the one before)
    # and for an attempt running (:current_status 'running', :current_attempts its own).
    "skip_verdict": (
        "CASE WHEN status = 'cancelled' THEN 'cancelled' "
        "WHEN version <> :version THEN 'superseded' "
        "WHEN status <> :current_status OR attempts <> :current_attempts THEN 'duplicate' END"
    ),
    # The queue job id of a row's next attempt: its only spelling (duejobs.delivery pushes the
    # id it finds on the row and only parses ids back). Computed here so that claiming and
    # marking a batch is one UPDATE.
    "job_id": (
        "'dj-' || replace({0}.tenant, '.', '_') || '-' || replace(CAST({0}.id AS text), '-', '') "
        "|| '-v' || {0}.version || '-a' || ({0}.attempts + 1)"
    ),
    # A tenant's cap ({0}: max_live or max_inflight) of tenant {1}: its own, else the
    # default's, else none.
    "quota": (
        "COALESCE((SELECT {0} FROM tenant_quotas WHERE tenant = {1}), "
        f"(SELECT {{0}} FROM tenant_quotas WHERE tenant = '{DEFAULT_QUOTA_TENANT}'))"
    ),
    # A tenant's ({0}) jobs in flight: pushed (counted up to its cap {1}) plus running.
    "inflight": (
        "((SELECT count(*) FROM (SELECT 1 FROM scheduled_jobs WHERE tenant = {0} "
        "AND status = 'scheduled' AND queue_job_id IS NOT NULL LIMIT {1}) AS pushed) "
        "+ (SELECT count(*) FROM scheduled_jobs WHERE status = 'running' AND tenant = {0}))"
    ),
    # Rows {0} of tenant {1} due up to {2}, spelled as a range of (tenant, due_at) pairs
    # without `tenant = ...`, so that only the per-tenant claim index can serve it: with the
    # equality the planner may take the global due_at index and filter out every other
    # tenant's rows on the way.
    "tenant_range": (
        "({0}.tenant, {0}.due_at) >= ({1}, CAST('-infinity' AS timestamptz)) "
        "AND ({0}.tenant, {0}.due_at) <= ({1}, {2})"
    ),
    # Rows {0} of tenant {1} (with in-flight cap {2}) waiting to be pushed that are due: within
    # the window, or only those already due for a tenant with an in-flight cap (its backlog
    # waits in the table, not in Redis).
    "tenant_due": (
        "{0}.status = 'scheduled' AND {0}.queue_job_id IS NULL AND {{{{tenant_range({0}, {1}, "
        "statement_timestamp() + CASE WHEN {2} IS NULL THEN CAST(:window AS interval) "
        "ELSE interval '0' END)}}}}"
    ),
    # One part of a list of schedules: the rows in states {0} (spelled as their partial indexes
    # spell them, so that one index serves the part), skipped outright when the list keeps
    # none of the states {1}; read past the cursor with {2} ('>' or '<') in {3} order.
    "list_part": (
        "SELECT {{{{schedule_columns}}}} FROM scheduled_jobs "
        "WHERE {0} AND (CAST(:statuses AS text[]) IS NULL OR CAST(:statuses AS text[]) && {1}) "
        "AND {{{{list_filter}}}} "
        "AND (CAST(:after_due AS timestamptz) IS NULL OR (due_at, id) {2} (:after_due, :after_id)) "
        "ORDER BY due_at {3}, id {3} LIMIT :limit"
    ),
    # The filters of a list of schedules; a NULL parameter filters nothing.
    "list_filter": (
        "{{tenant_filter}} "
        "AND (CAST(:statuses AS text[]) IS NULL OR status = ANY(:statuses)) "
        "AND (CAST(:type AS text) IS NULL OR type = :type) "
        "AND (CAST(:key AS text) IS NULL OR key = :key) "
        "AND (CAST(:queue AS text) IS NULL OR queue = :queue) "
        "AND (CAST(:due_from AS timestamptz) IS NULL OR due_at >= :due_from) "
        "AND (CAST(:due_before AS timestamptz) IS NULL OR due_at < :due_before) "
        "AND (CAST(:recurring_ids AS uuid[]) IS NULL OR recurring_id = ANY(:recurring_ids))"
    ),
    # one count per event kind, named after it (the kinds come from the enum)
    "count_by_kind": ", ".join(
        f"count(*) FILTER (WHERE kind = '{k.value}') AS {k.value}" for k in EventKind
    ),
}
_NAME = re.compile(r"^-- name: (\w+)\s*$", re.MULTILINE)
# {{name}} or {{name(arg, arg)}}; an argument may hold one level of parentheses.
_FRAGMENT = re.compile(r"\{\{(\w+)(?:\(((?:[^()]|\([^()]*\))*)\))?\}\}")
_PARAM = re.compile(r"(?<![:\w]):(\w+)")


@dataclass(frozen=True)
class Query:
    """One named statement: as written (``:name`` parameters), and as psycopg takes it."""

    name: str
    sql: str
    driver_sql: str


def _expand(name: str, sql: str) -> str:
    def fragment(match: re.Match[str]) -> str:
        try:
            body = FRAGMENTS[match[1]]
        except KeyError:
            raise ValueError(f"query {name}: unknown fragment {match[0]}") from None
        args = _split_args(match[2]) if match[2] is not None else []
        wanted = {field for _, field, _, _ in string.Formatter().parse(body) if field}
        if args and len(args) != len(wanted):
            raise ValueError(f"query {name}: {match[0]} takes {len(wanted)} arguments")
        return body.format(*args) if args else body

    for _ in range(5):  # fragments may use fragments, a few levels deep
        expanded = _FRAGMENT.sub(fragment, sql)
        if expanded == sql:
            if "{{" in sql:  # a fragment the pattern could not read (arguments nested deep)
                raise ValueError(
                    f"query {name}: a fragment left unexpanded: {sql[sql.index('{{') :][:60]}"
                )
            return sql
        sql = expanded
    raise ValueError(f"query {name}: fragments nested too deep")


def _split_args(text: str) -> list[str]:
    """Split fragment arguments at the commas outside parentheses."""
    args, depth, current = [], 0, ""
    for char in text:
        if char == "," and depth == 0:
            args.append(current.strip())
            current = ""
            continue
        depth += {"(": 1, ")": -1}.get(char, 0)
        current += char
    return [*args, current.strip()]


def parse(text: str, source: str) -> dict[str, Query]:
    """The named blocks of one file."""
    parts = _NAME.split(text)
    if parts[0].strip() and not all(
        line.startswith("--") or not line.strip() for line in parts[0].splitlines()
    ):
        raise ValueError(f"{source}: SQL before the first '-- name:' line")
    found: dict[str, Query] = {}
    for name, body in zip(parts[1::2], parts[2::2], strict=True):
        # Whole-line comments say why; the statement is sent without them.
        code = "\n".join(line for line in body.splitlines() if not line.lstrip().startswith("--"))
        sql = _expand(name, code.strip().rstrip(";").strip())
        if not sql:
            raise ValueError(f"{source}: query {name} is empty")
        if name in found:
            raise ValueError(f"{source}: query {name} appears twice")
        driver_sql = _PARAM.sub(r"%(\1)s", sql.replace("%", "%%"))
        found[name] = Query(name, sql, driver_sql)
    return found


def load() -> dict[str, Query]:
    """Every named statement of every ``sql/*.sql`` file."""
    queries: dict[str, Query] = {}
    for path in sorted(files("duejobs.store").joinpath("sql").iterdir(), key=lambda p: p.name):
        if not path.name.endswith(".sql"):
            continue
        for name, query in parse(path.read_text(encoding="utf-8"), path.name).items():
            if name in queries:
                raise ValueError(f"{path.name}: query {name} is already defined elsewhere")
            queries[name] = query
    return queries


QUERIES = load()

SCHEMA_OPTION = "duejobs_schema"
"""The execution option (on an engine or a connection) naming the schema of duejobs' tables."""

TABLES = (
    "scheduled_jobs",
    "scheduled_job_events",
    "scheduled_job_attempts",
    "scheduled_job_effects",
    "scheduled_job_keys",
    "scheduled_job_results",
    "recurring_schedules",
    "tenant_quotas",
    "duejobs_partitioning",
)
# Of those, the tables only partitioned mode has (duejobs/store/partitions.py).
PARTITIONED_MODE_TABLES = ("scheduled_job_keys", "duejobs_partitioning")
_TABLE = re.compile(r"(?<![.\w])(" + "|".join(TABLES) + r")\b")
_IN_SCHEMA: dict[str, dict[str, Query]] = {}


def in_schema(schema: str) -> dict[str, Query]:
    """Every statement with duejobs' tables in ``schema`` (a checked identifier): the
    statements stay independent of the connection's ``search_path``, so a caller's own
    connection (``conn=``) reaches them too."""
    if schema == "public":
        return QUERIES
    found = _IN_SCHEMA.get(schema)
    if found is None:
        found = _IN_SCHEMA[schema] = {
            name: Query(
                name,
                _TABLE.sub(rf"{schema}.\1", query.sql),
                _TABLE.sub(rf"{schema}.\1", query.driver_sql),
            )
            for name, query in QUERIES.items()
        }
    return found
