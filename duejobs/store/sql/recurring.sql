-- Recurring definitions and their occurrences.

-- name: get_recurring
SELECT id, tenant, name, type, payload, cron, timezone, dst_gap, dst_overlap, misfire, grace,
    status, version, next_run_at, created_at, updated_at, queue, priority,
    last_error FROM /*schema*/recurring_schedules WHERE tenant = :tenant AND name = :name

-- name: list_recurring
-- Every definition of one tenant (or of all), by tenant and name; a page of them at most.
SELECT id, tenant, name, type, payload, cron, timezone, dst_gap, dst_overlap, misfire, grace,
    status, version, next_run_at, created_at, updated_at, queue, priority,
    last_error FROM /*schema*/recurring_schedules
WHERE (CAST(:tenant AS text) IS NULL OR tenant = :tenant) ORDER BY tenant, name LIMIT :limit

-- name: get_recurring_locked
-- The same, locked to the end of the transaction: read, merge and write as one change.
SELECT id, tenant, name, type, payload, cron, timezone, dst_gap, dst_overlap, misfire, grace,
    status, version, next_run_at, created_at, updated_at, queue, priority,
    last_error FROM /*schema*/recurring_schedules
WHERE tenant = :tenant AND name = :name FOR UPDATE

-- name: save_recurring
-- Create the definition, or replace it at version + 1; nothing when an active definition is
-- already exactly this one (compared as PostgreSQL stores it). A quarantined definition
-- becomes active again.
INSERT INTO /*schema*/recurring_schedules
    (id, tenant, name, type, payload, cron, timezone, dst_gap, dst_overlap,
     misfire, grace, next_run_at, queue, priority)
VALUES (:id, :tenant, :name, :type, CAST(:payload_json AS jsonb), :cron, :timezone,
        :dst_gap, :dst_overlap, :misfire, :grace, :next_run_at, :queue,
        CAST(:priority AS smallint))
ON CONFLICT (tenant, name) DO UPDATE
SET type = EXCLUDED.type, payload = EXCLUDED.payload, cron = EXCLUDED.cron,
    queue = EXCLUDED.queue, priority = EXCLUDED.priority,
    timezone = EXCLUDED.timezone, dst_gap = EXCLUDED.dst_gap,
    dst_overlap = EXCLUDED.dst_overlap, misfire = EXCLUDED.misfire,
    grace = EXCLUDED.grace, next_run_at = EXCLUDED.next_run_at,
    version = /*schema*/recurring_schedules.version + 1, updated_at = statement_timestamp(),
    status = CASE WHEN /*schema*/recurring_schedules.status = 'error' THEN 'active'
                  ELSE /*schema*/recurring_schedules.status END,
    last_error = NULL
WHERE (/*schema*/recurring_schedules.type, /*schema*/recurring_schedules.payload,
       /*schema*/recurring_schedules.cron, /*schema*/recurring_schedules.timezone,
       /*schema*/recurring_schedules.dst_gap, /*schema*/recurring_schedules.dst_overlap,
       /*schema*/recurring_schedules.misfire, /*schema*/recurring_schedules.grace,
       /*schema*/recurring_schedules.queue, /*schema*/recurring_schedules.priority,
       /*schema*/recurring_schedules.status)
      IS DISTINCT FROM
      (EXCLUDED.type, EXCLUDED.payload, EXCLUDED.cron, EXCLUDED.timezone,
       EXCLUDED.dst_gap, EXCLUDED.dst_overlap, EXCLUDED.misfire, EXCLUDED.grace,
       EXCLUDED.queue, EXCLUDED.priority, 'active')
RETURNING id, tenant, name, type, payload, cron, timezone, dst_gap, dst_overlap, misfire, grace,
    status, version, next_run_at, created_at, updated_at, queue, priority, last_error

-- name: quarantine_recurring
WITH upd AS (
    UPDATE /*schema*/recurring_schedules
    SET status = 'error', last_error = :error, updated_at = statement_timestamp()
    WHERE id = :id
    RETURNING id, tenant, version
)
INSERT INTO /*schema*/scheduled_job_events (schedule_id, tenant, kind, version, detail)
SELECT id, tenant, 'quarantined', version, jsonb_build_object('error', :error)
FROM upd

-- name: set_recurring_status
UPDATE /*schema*/recurring_schedules SET status = :status, version = version + 1,
       next_run_at = COALESCE(CAST(:next_run_at AS timestamptz), next_run_at),
       updated_at = statement_timestamp()
WHERE id = :id RETURNING id, tenant, name, type, payload, cron, timezone, dst_gap, dst_overlap,
    misfire, grace, status, version, next_run_at, created_at, updated_at, queue, priority, last_error

-- name: delete_recurring
DELETE FROM /*schema*/recurring_schedules WHERE id = :id

-- name: cancel_occurrences
-- Cancel the occurrences still waiting to run; the queue jobs to discard.
WITH upd AS (
    UPDATE /*schema*/scheduled_jobs
    SET status = 'cancelled', version = version + 1,
        finished_at = statement_timestamp(), updated_at = statement_timestamp()
    WHERE recurring_id = :rid AND status = 'scheduled'
    RETURNING id, tenant, version, queue, queue_job_id
), event AS (
    INSERT INTO /*schema*/scheduled_job_events (schedule_id, tenant, kind, version, detail)
    SELECT id, tenant, 'cancelled', version, jsonb_build_object('reason', CAST(:reason AS text))
    FROM upd
)
SELECT queue_job_id, queue FROM upd WHERE queue_job_id IS NOT NULL

-- name: due_recurring
SELECT id, tenant, name, type, payload, cron, timezone, dst_gap, dst_overlap, misfire, grace,
    status, version, next_run_at, created_at, updated_at, queue, priority,
    last_error FROM /*schema*/recurring_schedules
WHERE status = 'active' AND next_run_at <= statement_timestamp() + CAST(:window AS interval)
ORDER BY next_run_at FOR UPDATE SKIP LOCKED LIMIT :limit

-- name: insert_occurrences
-- Occurrences as ordinary schedules; one already there (another scheduler made it) is left
-- alone. How many were new.
WITH new AS (
    INSERT INTO /*schema*/scheduled_jobs
        (id, tenant, type, payload, run_at, due_at, timezone, local_run_at,
         recurring_id, recurring_version, queue, priority)
    SELECT o.id, :tenant, :type, CAST(:payload AS jsonb), o.run_at, o.run_at,
           :timezone, o.local_run_at, :rid, :version, :queue, CAST(:priority AS smallint)
    FROM unnest(CAST(:ids AS uuid[]), CAST(:run_ats AS timestamptz[]),
                CAST(:locals AS timestamp[])) AS o(id, run_at, local_run_at)
    ON CONFLICT DO NOTHING
    RETURNING id, tenant, version, run_at
), event AS (
    INSERT INTO /*schema*/scheduled_job_events (schedule_id, tenant, kind, version, detail)
    SELECT id, tenant, 'created', version,
           jsonb_build_object('run_at',
               (to_jsonb(CAST(run_at AS timestamptz) AT TIME ZONE 'UTC') #>> '{}') || '+00:00',
               'recurring', CAST(:name AS text),
                              'recurring_version', CAST(:version AS integer))
    FROM new
)
SELECT count(*) AS created FROM new

-- name: advance_recurring
UPDATE /*schema*/recurring_schedules SET next_run_at = :next WHERE id = :id
