-- Schedules one at a time: create, read, reschedule, cancel, history.

-- name: insert_schedule
-- Create a schedule with its `created` event; nothing when a live schedule holds the key.
WITH new AS (
    INSERT INTO /*schema*/scheduled_jobs
        (id, tenant, type, key, payload, run_at, due_at, jitter_offset, expires_after,
         max_attempts, timezone, local_run_at, queue, trace_context, priority)
    SELECT :id, :tenant, :type, :key, CAST(:payload AS jsonb),
        COALESCE(CAST(:run_at AS timestamptz), statement_timestamp() + CAST(:delay AS interval)),
           COALESCE(CAST(:run_at AS timestamptz),
               statement_timestamp() + CAST(:delay AS interval)) + CAST(:jitter_offset AS
               interval), :jitter_offset,
           CAST(:expires_after AS interval), CAST(:max_attempts AS integer), :timezone,
           :local_run_at, :queue, :trace_context, CAST(:priority AS smallint)
    -- the key is held by a live schedule: seen here, or (one committed since this statement
    -- began) by the unique index of the plain schema, which skips the row, or the key
    -- trigger of partitioned mode, which fails it (duejobs/store/partitions.py)
    WHERE NOT EXISTS (SELECT 1 FROM /*schema*/scheduled_jobs holder WHERE holder.tenant = :tenant
        AND holder.key = :key AND holder.status IN ('scheduled', 'running'))
    ON CONFLICT DO NOTHING
    RETURNING id, tenant, type, key, payload, run_at, due_at, timezone, local_run_at, status,
        queue_job_id, version, attempts, last_error, created_at, updated_at, started_at,
        finished_at, queue, priority
), event AS (
    INSERT INTO /*schema*/scheduled_job_events (schedule_id, tenant, kind, version, detail)
    SELECT id, tenant, 'created', version, CASE WHEN timezone IS NULL AND local_run_at IS NULL
        AND key IS NULL AND due_at = run_at THEN jsonb_build_object('run_at',
        (to_jsonb(CAST(run_at AS timestamptz) AT TIME ZONE 'UTC') #>> '{}') || '+00:00')
        ELSE jsonb_strip_nulls(jsonb_build_object('run_at',
        (to_jsonb(CAST(run_at AS timestamptz) AT TIME ZONE 'UTC') #>> '{}') || '+00:00',
        'timezone', timezone, 'local_run_at', local_run_at, 'key', key, 'due_at',
        (to_jsonb(CAST(CASE
        WHEN due_at <> run_at THEN due_at END AS timestamptz) AT TIME ZONE 'UTC') #>> '{}') ||
        '+00:00')) END
    FROM new
)
SELECT id, tenant, type, key, payload, run_at, due_at, timezone, local_run_at, status,
    queue_job_id, version, attempts, last_error, created_at, updated_at, started_at, finished_at,
    queue, priority FROM new

-- name: live_by_key
SELECT id, tenant, type, key, payload, run_at, due_at, timezone, local_run_at, status,
    queue_job_id, version, attempts, last_error, created_at, updated_at, started_at, finished_at,
    queue, priority FROM /*schema*/scheduled_jobs WHERE tenant = :tenant AND key = :key
    AND status IN ('scheduled', 'running')

-- name: get_schedule
SELECT id, tenant, type, key, payload, run_at, due_at, timezone, local_run_at, status,
    queue_job_id, version, attempts, last_error, created_at, updated_at, started_at, finished_at,
    queue, priority FROM /*schema*/scheduled_jobs WHERE id = :id
    AND (CAST(:tenant AS text) IS NULL OR tenant = :tenant)

-- name: reschedule
-- Move a live schedule to a new time under version + 1, with its `rescheduled` event; the
-- status it had (a running version goes on until its handler checks).
WITH cur AS (
    SELECT id, run_at AS old_run_at, version AS old_version, queue_job_id AS old_queue_job_id,
        status AS old_status
    FROM /*schema*/scheduled_jobs
    WHERE id = :id AND (CAST(:tenant AS text) IS NULL OR tenant = :tenant)
        AND status IN ('scheduled', 'running')
      AND (CAST(:expected AS integer) IS NULL OR version = :expected)
    FOR UPDATE
), upd AS (
    UPDATE /*schema*/scheduled_jobs s
    SET run_at = COALESCE(CAST(:run_at AS timestamptz),
        statement_timestamp() + CAST(:delay AS interval)),
        due_at = COALESCE(CAST(:run_at AS timestamptz),
            statement_timestamp() + CAST(:delay AS interval)) + s.jitter_offset,
        timezone = COALESCE(CAST(:timezone AS text), s.timezone),
        local_run_at = :local_run_at,
        priority = COALESCE(CAST(:priority AS smallint), s.priority),
        version = s.version + 1,
        status = 'scheduled',
        queue_job_id = NULL,
        attempts = 0,
        interruptions = 0,
        updated_at = statement_timestamp(),
        enqueued_at = NULL,
        started_at = NULL,
        lease_expires_at = NULL
    FROM cur
    WHERE s.id = :id AND s.id = cur.id
    RETURNING s.*, cur.old_run_at, cur.old_version, cur.old_queue_job_id, cur.old_status
), event AS (
    INSERT INTO /*schema*/scheduled_job_events (schedule_id, tenant, kind, version, detail)
    SELECT id, tenant, 'rescheduled', version,
           jsonb_build_object('old_run_at',
               (to_jsonb(CAST(old_run_at AS timestamptz) AT TIME ZONE 'UTC') #>> '{}') || '+00:00',
               'new_run_at', (to_jsonb(CAST(run_at AS timestamptz) AT TIME ZONE 'UTC') #>> '{}') ||
               '+00:00',
                              'old_version', old_version, 'timezone', timezone,
                              'local_run_at', local_run_at)
           || CASE WHEN CAST(:priority AS smallint) IS NULL THEN CAST('{}' AS jsonb)
                   ELSE jsonb_build_object('priority', CAST(:priority AS smallint)) END
    FROM upd
)
SELECT id, tenant, type, key, payload, run_at, due_at, timezone, local_run_at, status,
    queue_job_id, version, attempts, last_error, created_at, updated_at, started_at, finished_at,
    queue, priority, old_queue_job_id, old_status FROM upd

-- name: cancel
-- Cancel a live schedule (version + 1) with its `cancelled` event; its queue job id.
WITH cur AS (
    SELECT id, queue_job_id FROM /*schema*/scheduled_jobs
    WHERE id = :id AND (CAST(:tenant AS text) IS NULL OR tenant = :tenant)
        AND status IN ('scheduled', 'running')
    FOR UPDATE
), upd AS (
    UPDATE /*schema*/scheduled_jobs s
    SET status = 'cancelled', version = s.version + 1,
        updated_at = statement_timestamp(), finished_at = statement_timestamp()
    FROM cur
    WHERE s.id = :id AND s.id = cur.id
    RETURNING s.id, s.tenant, s.version, s.queue, cur.queue_job_id
), event AS (
    INSERT INTO /*schema*/scheduled_job_events (schedule_id, tenant, kind, version)
    SELECT id, tenant, 'cancelled', version FROM upd
)
SELECT queue_job_id, queue FROM upd

-- name: retry
-- A failed or cancelled schedule scheduled again as version + 1: attempts from zero, due at
-- the new time, its `rescheduled` event marked as a retry. Nothing for any other status.
WITH cur AS (
    SELECT id, run_at AS old_run_at, version AS old_version, status AS old_status
    FROM /*schema*/scheduled_jobs
    WHERE id = :id AND (CAST(:tenant AS text) IS NULL OR tenant = :tenant)
        AND status IN ('failed', 'cancelled')
    FOR UPDATE
), upd AS (
    UPDATE /*schema*/scheduled_jobs s
    SET run_at = COALESCE(CAST(:run_at AS timestamptz),
        statement_timestamp() + CAST(:delay AS interval)),
        due_at = COALESCE(CAST(:run_at AS timestamptz),
            statement_timestamp() + CAST(:delay AS interval)) + s.jitter_offset,
        timezone = COALESCE(CAST(:timezone AS text), s.timezone),
        local_run_at = :local_run_at,
        version = s.version + 1,
        status = 'scheduled',
        queue_job_id = NULL,
        attempts = 0,
        interruptions = 0,
        last_error = NULL,
        updated_at = statement_timestamp(),
        enqueued_at = NULL,
        started_at = NULL,
        finished_at = NULL,
        lease_expires_at = NULL
    FROM cur
    WHERE s.id = :id AND s.id = cur.id
    RETURNING s.*, cur.old_run_at, cur.old_version, cur.old_status
), event AS (
    INSERT INTO /*schema*/scheduled_job_events (schedule_id, tenant, kind, version, detail)
    SELECT id, tenant, 'rescheduled', version,
           jsonb_build_object('retry', true, 'old_status', old_status,
                              'old_run_at', (to_jsonb(CAST(old_run_at AS timestamptz) AT TIME ZONE
                                  'UTC') #>> '{}') || '+00:00', 'new_run_at',
                                  (to_jsonb(CAST(run_at AS timestamptz) AT TIME ZONE 'UTC') #>>
                                  '{}') || '+00:00',
                              'old_version', old_version)
    FROM upd
)
SELECT id, tenant, type, key, payload, run_at, due_at, timezone, local_run_at, status,
    queue_job_id, version, attempts, last_error, created_at, updated_at, started_at, finished_at,
    queue, priority FROM upd

-- name: history_newest
-- A page of a schedule's events, newest first, before the event id :before (the primary
-- key (schedule_id, id) serves it, however long the history).
SELECT id, schedule_id, kind, version, at, detail FROM /*schema*/scheduled_job_events
WHERE schedule_id = :id AND (CAST(:tenant AS text) IS NULL OR tenant = :tenant)
    AND (CAST(:before AS bigint) IS NULL OR id < :before)
ORDER BY id DESC LIMIT :limit

-- name: attempts
-- A schedule's attempts, every version's, in the order they started.
SELECT version, attempt, status, worker, started_at, finished_at, next_attempt_at, error
FROM /*schema*/scheduled_job_attempts
WHERE schedule_id = :id AND (CAST(:tenant AS text) IS NULL OR tenant = :tenant)
ORDER BY version, attempt

-- name: attempts_newest
-- A schedule's latest attempts, newest first.
SELECT version, attempt, status, worker, started_at, finished_at, next_attempt_at, error
FROM /*schema*/scheduled_job_attempts
WHERE schedule_id = :id AND (CAST(:tenant AS text) IS NULL OR tenant = :tenant)
ORDER BY version DESC, attempt DESC LIMIT :limit

-- name: is_past_run_at
SELECT run_at <= statement_timestamp() AS past FROM /*schema*/scheduled_jobs
WHERE id = :id AND (CAST(:tenant AS text) IS NULL OR tenant = :tenant)

-- name: database_now
SELECT statement_timestamp() AS now

-- name: backend_pid
-- The server process of this session: a pooler's connection reports another (store.connecting).
SELECT pg_backend_pid() AS pid

-- name: advisory_lock
SELECT pg_advisory_xact_lock(:key)
