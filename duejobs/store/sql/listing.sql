-- Listing: pages of schedules by filter, in (due_at, id) order from a cursor. A NULL
-- parameter is no filter. Rows are read in four parts, each from an index that a schedule's
-- own life already writes (waiting to be pushed, pushed, running) or that it gets once, when
-- it finishes (migration 0007): listing adds no index write to scheduling, claiming or
-- running a schedule. Each part spells the whole filter: inside the part, before its LIMIT,
-- is where the planner keeps its index's order (one filter outside the union would read
-- every row of a part before it); tests/test_queries.py holds the eight copies to one
-- spelling.

-- name: list_schedules
SELECT * FROM (
    (SELECT id, tenant, type, key, payload, run_at, due_at, timezone, local_run_at, status,
        queue_job_id, version, attempts, last_error, created_at, updated_at, started_at,
        finished_at, queue, priority FROM /*schema*/scheduled_jobs WHERE status = 'scheduled'
        AND queue_job_id IS NULL
        AND (CAST(:statuses AS text[]) IS NULL
        OR CAST(:statuses AS text[]) && CAST('{scheduled}' AS text[]))
        AND (CAST(:tenant AS text) IS NULL OR tenant = :tenant)
        AND (CAST(:statuses AS text[]) IS NULL OR status = ANY(:statuses))
        AND (CAST(:type AS text) IS NULL OR type = :type)
        AND (CAST(:key AS text) IS NULL OR key = :key)
        AND (CAST(:queue AS text) IS NULL OR queue = :queue)
        AND (CAST(:due_from AS timestamptz) IS NULL OR due_at >= :due_from)
        AND (CAST(:due_before AS timestamptz) IS NULL OR due_at < :due_before)
        AND (CAST(:recurring_ids AS uuid[]) IS NULL OR recurring_id = ANY(:recurring_ids))
        AND (CAST(:after_due AS timestamptz) IS NULL
        OR (due_at, id) > (:after_due, :after_id)) ORDER BY due_at ASC, id ASC LIMIT :limit)
    UNION ALL
    (SELECT id, tenant, type, key, payload, run_at, due_at, timezone, local_run_at, status,
        queue_job_id, version, attempts, last_error, created_at, updated_at, started_at,
        finished_at, queue, priority FROM /*schema*/scheduled_jobs WHERE status = 'scheduled'
        AND queue_job_id IS NOT NULL
        AND (CAST(:statuses AS text[]) IS NULL
        OR CAST(:statuses AS text[]) && CAST('{scheduled}' AS text[]))
        AND (CAST(:tenant AS text) IS NULL OR tenant = :tenant)
        AND (CAST(:statuses AS text[]) IS NULL OR status = ANY(:statuses))
        AND (CAST(:type AS text) IS NULL OR type = :type)
        AND (CAST(:key AS text) IS NULL OR key = :key)
        AND (CAST(:queue AS text) IS NULL OR queue = :queue)
        AND (CAST(:due_from AS timestamptz) IS NULL OR due_at >= :due_from)
        AND (CAST(:due_before AS timestamptz) IS NULL OR due_at < :due_before)
        AND (CAST(:recurring_ids AS uuid[]) IS NULL OR recurring_id = ANY(:recurring_ids))
        AND (CAST(:after_due AS timestamptz) IS NULL
        OR (due_at, id) > (:after_due, :after_id)) ORDER BY due_at ASC, id ASC LIMIT :limit)
    UNION ALL
    (SELECT id, tenant, type, key, payload, run_at, due_at, timezone, local_run_at, status,
        queue_job_id, version, attempts, last_error, created_at, updated_at, started_at,
        finished_at, queue, priority FROM /*schema*/scheduled_jobs WHERE status = 'running'
        AND (CAST(:statuses AS text[]) IS NULL
        OR CAST(:statuses AS text[]) && CAST('{running}' AS text[]))
        AND (CAST(:tenant AS text) IS NULL OR tenant = :tenant)
        AND (CAST(:statuses AS text[]) IS NULL OR status = ANY(:statuses))
        AND (CAST(:type AS text) IS NULL OR type = :type)
        AND (CAST(:key AS text) IS NULL OR key = :key)
        AND (CAST(:queue AS text) IS NULL OR queue = :queue)
        AND (CAST(:due_from AS timestamptz) IS NULL OR due_at >= :due_from)
        AND (CAST(:due_before AS timestamptz) IS NULL OR due_at < :due_before)
        AND (CAST(:recurring_ids AS uuid[]) IS NULL OR recurring_id = ANY(:recurring_ids))
        AND (CAST(:after_due AS timestamptz) IS NULL
        OR (due_at, id) > (:after_due, :after_id)) ORDER BY due_at ASC, id ASC LIMIT :limit)
    UNION ALL
    (SELECT id, tenant, type, key, payload, run_at, due_at, timezone, local_run_at, status,
        queue_job_id, version, attempts, last_error, created_at, updated_at, started_at,
        finished_at, queue, priority FROM /*schema*/scheduled_jobs WHERE status IN ('succeeded', 'failed',
        'cancelled') AND (CAST(:statuses AS text[]) IS NULL
        OR CAST(:statuses AS text[]) && CAST('{succeeded,failed,cancelled}' AS text[]))
        AND (CAST(:tenant AS text) IS NULL OR tenant = :tenant)
        AND (CAST(:statuses AS text[]) IS NULL OR status = ANY(:statuses))
        AND (CAST(:type AS text) IS NULL OR type = :type)
        AND (CAST(:key AS text) IS NULL OR key = :key)
        AND (CAST(:queue AS text) IS NULL OR queue = :queue)
        AND (CAST(:due_from AS timestamptz) IS NULL OR due_at >= :due_from)
        AND (CAST(:due_before AS timestamptz) IS NULL OR due_at < :due_before)
        AND (CAST(:recurring_ids AS uuid[]) IS NULL OR recurring_id = ANY(:recurring_ids))
        AND (CAST(:after_due AS timestamptz) IS NULL
        OR (due_at, id) > (:after_due, :after_id)) ORDER BY due_at ASC, id ASC LIMIT :limit)
) AS listed
ORDER BY due_at, id
LIMIT :limit

-- name: list_schedules_latest_first
SELECT * FROM (
    (SELECT id, tenant, type, key, payload, run_at, due_at, timezone, local_run_at, status,
        queue_job_id, version, attempts, last_error, created_at, updated_at, started_at,
        finished_at, queue, priority FROM /*schema*/scheduled_jobs WHERE status = 'scheduled'
        AND queue_job_id IS NULL
        AND (CAST(:statuses AS text[]) IS NULL
        OR CAST(:statuses AS text[]) && CAST('{scheduled}' AS text[]))
        AND (CAST(:tenant AS text) IS NULL OR tenant = :tenant)
        AND (CAST(:statuses AS text[]) IS NULL OR status = ANY(:statuses))
        AND (CAST(:type AS text) IS NULL OR type = :type)
        AND (CAST(:key AS text) IS NULL OR key = :key)
        AND (CAST(:queue AS text) IS NULL OR queue = :queue)
        AND (CAST(:due_from AS timestamptz) IS NULL OR due_at >= :due_from)
        AND (CAST(:due_before AS timestamptz) IS NULL OR due_at < :due_before)
        AND (CAST(:recurring_ids AS uuid[]) IS NULL OR recurring_id = ANY(:recurring_ids))
        AND (CAST(:after_due AS timestamptz) IS NULL
        OR (due_at, id) < (:after_due, :after_id)) ORDER BY due_at DESC, id DESC LIMIT :limit)
    UNION ALL
    (SELECT id, tenant, type, key, payload, run_at, due_at, timezone, local_run_at, status,
        queue_job_id, version, attempts, last_error, created_at, updated_at, started_at,
        finished_at, queue, priority FROM /*schema*/scheduled_jobs WHERE status = 'scheduled'
        AND queue_job_id IS NOT NULL
        AND (CAST(:statuses AS text[]) IS NULL
        OR CAST(:statuses AS text[]) && CAST('{scheduled}' AS text[]))
        AND (CAST(:tenant AS text) IS NULL OR tenant = :tenant)
        AND (CAST(:statuses AS text[]) IS NULL OR status = ANY(:statuses))
        AND (CAST(:type AS text) IS NULL OR type = :type)
        AND (CAST(:key AS text) IS NULL OR key = :key)
        AND (CAST(:queue AS text) IS NULL OR queue = :queue)
        AND (CAST(:due_from AS timestamptz) IS NULL OR due_at >= :due_from)
        AND (CAST(:due_before AS timestamptz) IS NULL OR due_at < :due_before)
        AND (CAST(:recurring_ids AS uuid[]) IS NULL OR recurring_id = ANY(:recurring_ids))
        AND (CAST(:after_due AS timestamptz) IS NULL
        OR (due_at, id) < (:after_due, :after_id)) ORDER BY due_at DESC, id DESC LIMIT :limit)
    UNION ALL
    (SELECT id, tenant, type, key, payload, run_at, due_at, timezone, local_run_at, status,
        queue_job_id, version, attempts, last_error, created_at, updated_at, started_at,
        finished_at, queue, priority FROM /*schema*/scheduled_jobs WHERE status = 'running'
        AND (CAST(:statuses AS text[]) IS NULL
        OR CAST(:statuses AS text[]) && CAST('{running}' AS text[]))
        AND (CAST(:tenant AS text) IS NULL OR tenant = :tenant)
        AND (CAST(:statuses AS text[]) IS NULL OR status = ANY(:statuses))
        AND (CAST(:type AS text) IS NULL OR type = :type)
        AND (CAST(:key AS text) IS NULL OR key = :key)
        AND (CAST(:queue AS text) IS NULL OR queue = :queue)
        AND (CAST(:due_from AS timestamptz) IS NULL OR due_at >= :due_from)
        AND (CAST(:due_before AS timestamptz) IS NULL OR due_at < :due_before)
        AND (CAST(:recurring_ids AS uuid[]) IS NULL OR recurring_id = ANY(:recurring_ids))
        AND (CAST(:after_due AS timestamptz) IS NULL
        OR (due_at, id) < (:after_due, :after_id)) ORDER BY due_at DESC, id DESC LIMIT :limit)
    UNION ALL
    (SELECT id, tenant, type, key, payload, run_at, due_at, timezone, local_run_at, status,
        queue_job_id, version, attempts, last_error, created_at, updated_at, started_at,
        finished_at, queue, priority FROM /*schema*/scheduled_jobs WHERE status IN ('succeeded', 'failed',
        'cancelled') AND (CAST(:statuses AS text[]) IS NULL
        OR CAST(:statuses AS text[]) && CAST('{succeeded,failed,cancelled}' AS text[]))
        AND (CAST(:tenant AS text) IS NULL OR tenant = :tenant)
        AND (CAST(:statuses AS text[]) IS NULL OR status = ANY(:statuses))
        AND (CAST(:type AS text) IS NULL OR type = :type)
        AND (CAST(:key AS text) IS NULL OR key = :key)
        AND (CAST(:queue AS text) IS NULL OR queue = :queue)
        AND (CAST(:due_from AS timestamptz) IS NULL OR due_at >= :due_from)
        AND (CAST(:due_before AS timestamptz) IS NULL OR due_at < :due_before)
        AND (CAST(:recurring_ids AS uuid[]) IS NULL OR recurring_id = ANY(:recurring_ids))
        AND (CAST(:after_due AS timestamptz) IS NULL
        OR (due_at, id) < (:after_due, :after_id)) ORDER BY due_at DESC, id DESC LIMIT :limit)
) AS listed
ORDER BY due_at DESC, id DESC
LIMIT :limit

-- name: recurring_ids
-- The recurring definitions of that name, of one tenant or of all: a list names them by
-- their ids, which the planner then sees (an id it would only learn while running hides how
-- many occurrences a definition has, and the index that finds them).
SELECT id FROM /*schema*/recurring_schedules WHERE name = :name
    AND (CAST(:tenant AS text) IS NULL OR tenant = :tenant)
