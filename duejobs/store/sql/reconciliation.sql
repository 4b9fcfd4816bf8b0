-- What the reconciler reads and writes: the window's rows, expired leases, states.

-- name: window_page
-- One page (keyset on due_at, id) of scheduled rows due within the window, locked (SKIP
-- LOCKED), with their deterministic queue job id, recorded (with an `enqueued` event) on
-- the rows whose id differs from the one stored: those no scheduler has pushed yet.
WITH page AS (
    SELECT s.id, s.tenant, s.version, s.attempts + 1 AS attempt, s.due_at, s.queue,
           s.priority, s.queue_job_id AS current, 'dj-' || replace(s.tenant, '.',
               '_') || '-' || replace(CAST(s.id AS text), '-',
               '') || '-v' || s.version || '-a' || (s.attempts + 1) AS job
    FROM /*schema*/scheduled_jobs s
    WHERE s.status = 'scheduled'
      AND s.due_at <= statement_timestamp() + CAST(:window AS interval)
      AND (s.due_at, s.id) > (CAST(:after_due AS timestamptz), CAST(:after_id AS uuid))
      -- a never-pushed row of a tenant with an in-flight quota, or under a rate limit, is the
      -- scheduler's to push, when the quota leaves room or the limit's pace has a start for it
      AND (s.queue_job_id IS NOT NULL
          OR COALESCE((SELECT max_inflight FROM /*schema*/tenant_quotas WHERE tenant = s.tenant),
          (SELECT max_inflight FROM /*schema*/tenant_quotas WHERE tenant = '*')) IS NULL
          AND NOT EXISTS (SELECT 1 FROM /*schema*/rate_limits l WHERE l.max_starts IS NOT NULL
              AND (l.scope, l.name) IN (('queue', s.queue), ('tenant', s.tenant),
                                        ('tenant', '*'))))
    ORDER BY s.due_at, s.id
    FOR UPDATE SKIP LOCKED
    LIMIT :limit
), upd AS (
    UPDATE /*schema*/scheduled_jobs s
    SET queue_job_id = 'dj-' || replace(s.tenant, '.', '_') || '-' || replace(CAST(s.id AS text),
        '-', '') || '-v' || s.version || '-a' || (s.attempts + 1),
        enqueued_at = statement_timestamp(),
        updated_at = statement_timestamp()
    WHERE s.id = ANY(ARRAY(SELECT id FROM page WHERE current IS DISTINCT FROM job))
    RETURNING s.id, s.tenant, s.version, s.queue_job_id
), event AS (
    INSERT INTO /*schema*/scheduled_job_events (schedule_id, tenant, kind, version, detail)
    SELECT id, tenant, 'enqueued', version,
           jsonb_build_object('queue_job_id', queue_job_id, 'by', 'reconciler')
    FROM upd
)
SELECT id, tenant, version, attempt, due_at, job AS queue_job_id,
       current IS NOT NULL AS was_pushed, queue, priority
FROM page
ORDER BY due_at, id

-- name: record_repushed
-- History for rows whose queue job had vanished and was pushed again.
INSERT INTO /*schema*/scheduled_job_events (schedule_id, tenant, kind, version, detail)
SELECT id, tenant, 'requeued', version,
       jsonb_build_object('reason', 'queue_job_missing', 'queue_job_id', job)
FROM /*schema*/scheduled_jobs JOIN unnest(CAST(:ids AS uuid[]), CAST(:jobs AS text[])) AS r(rid,
    job)
ON id = rid

-- name: rescue_expired
-- Running rows whose lease expired (their worker is gone): the attempt recorded as
-- abandoned; the row back to scheduled (due now), or failed with its attempts exhausted (the
-- interrupted ones not counted); and
-- how many running rows were past their lease.
WITH expired AS (
    SELECT id FROM /*schema*/scheduled_jobs
    WHERE status = 'running' AND lease_expires_at < statement_timestamp()
    ORDER BY lease_expires_at
    FOR UPDATE SKIP LOCKED
    LIMIT :limit
), upd AS (
    UPDATE /*schema*/scheduled_jobs s
    SET status = CASE WHEN s.attempts - s.interruptions >= s.max_attempts THEN 'failed'
                      ELSE 'scheduled' END,
        queue_job_id = NULL,
        due_at = statement_timestamp(),
        lease_expires_at = NULL,
        last_error = 'attempt ' || s.attempts || ' abandoned: its worker stopped renewing '
                     || 'the lease',
        finished_at = CASE WHEN s.attempts - s.interruptions >= s.max_attempts
                           THEN statement_timestamp() END,
        updated_at = statement_timestamp()
    WHERE s.id = ANY(ARRAY(SELECT id FROM expired))
    RETURNING s.id, s.tenant, s.version, s.attempts, s.status
), attempt AS (
    UPDATE /*schema*/scheduled_job_attempts a
    SET status = 'abandoned', finished_at = statement_timestamp(),
        error = 'the worker stopped renewing the lease'
    FROM upd
    WHERE a.schedule_id = upd.id AND a.version = upd.version AND a.attempt = upd.attempts
      AND a.status = 'running'
), event AS (
    INSERT INTO /*schema*/scheduled_job_events (schedule_id, tenant, kind, version, detail)
    SELECT id, tenant, 'abandoned', version,
           jsonb_build_object('attempt', attempts, 'then', status)
    FROM upd
    UNION ALL
    SELECT id, tenant, 'failed', version,
           jsonb_build_object('attempt', attempts, 'error', 'attempts exhausted')
    FROM upd WHERE status = 'failed'
)
SELECT status, count(*) AS n FROM upd GROUP BY status
UNION ALL
-- Every running row past its lease, as the statement found them (those rescued included): the
-- rest were locked by a transaction that outlived the lease.
SELECT 'past_lease', count(*) FROM /*schema*/scheduled_jobs
    WHERE status = 'running' AND lease_expires_at < statement_timestamp()

-- name: schedule_states
SELECT id, status, version FROM /*schema*/scheduled_jobs WHERE id = ANY(CAST(:ids AS uuid[]))

-- name: schedule_tenants
SELECT id, tenant FROM /*schema*/scheduled_jobs WHERE id = ANY(CAST(:ids AS uuid[]))

-- name: overdue_rows
-- Scheduled rows already due, oldest first; not those waiting unpushed under a rate limit set
-- (the query waiting_on_limits counts them).
SELECT queue_job_id, due_at,
       due_at < statement_timestamp() - CAST(:stuck AS interval) AS stuck, queue
FROM /*schema*/scheduled_jobs WHERE status = 'scheduled'
    AND (CAST(:tenant AS text) IS NULL OR tenant = :tenant)
    AND NOT (queue_job_id IS NULL AND (queue = ANY(CAST(:limited_queues AS text[]))
        OR tenant = ANY(CAST(:limited_tenants AS text[]))))
  AND due_at <= statement_timestamp() ORDER BY due_at LIMIT :limit

-- name: pending_deliveries
-- The scheduled rows of :ids (schedule ids) whose recorded queue job is still one of :jobs:
-- the deliveries a job left on a node its queue moved off still stands for.
SELECT s.id, s.tenant, s.version, s.attempts + 1 AS attempt, s.due_at, s.queue, s.queue_job_id,
       s.priority
FROM /*schema*/scheduled_jobs s
WHERE s.id = ANY(CAST(:ids AS uuid[])) AND s.status = 'scheduled'
  AND s.queue_job_id = ANY(CAST(:jobs AS text[]))
