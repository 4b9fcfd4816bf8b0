-- Schedules one at a time: create, read, reschedule, cancel, history.

-- name: insert_schedule
-- Create a schedule with its `created` event; nothing when a live schedule holds the key.
WITH new AS (
    INSERT INTO scheduled_jobs
        (id, tenant, type, key, payload, run_at, due_at, jitter_offset, expires_after,
         max_attempts, timezone, local_run_at, queue, trace_context)
    SELECT :id, :tenant, :type, :key, CAST(:payload AS jsonb), {{run_at}},
           {{run_at}} + CAST(:jitter_offset AS interval), :jitter_offset,
           CAST(:expires_after AS interval), CAST(:max_attempts AS integer), :timezone,
           :local_run_at, :queue, :trace_context
    -- the key is held by a live schedule: seen here, or (one committed since this statement
    -- began) by the unique index of the plain schema, which skips the row, or the key
    -- trigger of partitioned mode, which fails it (duejobs/store/partitions.py)
    WHERE NOT EXISTS ({{key_holder(:tenant, :key)}})
    ON CONFLICT DO NOTHING
    RETURNING {{schedule_columns}}
), event AS (
    INSERT INTO scheduled_job_events (schedule_id, tenant, kind, version, detail)
    SELECT id, tenant, 'created', version, {{created_detail}}
    FROM new
)
SELECT {{schedule_columns}} FROM new

-- name: live_by_key
SELECT {{schedule_columns}} FROM scheduled_jobs WHERE tenant = :tenant AND key = :key AND {{live}}

-- name: get_schedule
SELECT {{schedule_columns}} FROM scheduled_jobs WHERE id = :id AND {{tenant_filter}}

-- name: reschedule
-- Move a live schedule to a new time under version + 1, with its `rescheduled` event.
WITH cur AS (
    SELECT id, run_at AS old_run_at, version AS old_version, queue_job_id AS old_queue_job_id
    FROM scheduled_jobs
    WHERE id = :id AND {{tenant_filter}} AND {{live}}
      AND (CAST(:expected AS integer) IS NULL OR version = :expected)
    FOR UPDATE
), upd AS (
    UPDATE scheduled_jobs s
    SET run_at = {{run_at}},
        due_at = {{run_at}} + s.jitter_offset,
        timezone = COALESCE(CAST(:timezone AS text), s.timezone),
        local_run_at = :local_run_at,
        version = s.version + 1,
        status = 'scheduled',
        queue_job_id = NULL,
        attempts = 0,
        updated_at = statement_timestamp(),
        enqueued_at = NULL,
        started_at = NULL,
        lease_expires_at = NULL
    FROM cur
    WHERE s.id = :id AND s.id = cur.id
    RETURNING s.*, cur.old_run_at, cur.old_version, cur.old_queue_job_id
), event AS (
    INSERT INTO scheduled_job_events (schedule_id, tenant, kind, version, detail)
    SELECT id, tenant, 'rescheduled', version,
           jsonb_build_object('old_run_at', {{utc(old_run_at)}}, 'new_run_at', {{utc(run_at)}},
                              'old_version', old_version, 'timezone', timezone,
                              'local_run_at', local_run_at)
    FROM upd
)
SELECT {{schedule_columns}}, old_queue_job_id FROM upd

-- name: cancel
-- Cancel a live schedule (version + 1) with its `cancelled` event; its queue job id.
WITH cur AS (
    SELECT id, queue_job_id FROM scheduled_jobs
    WHERE id = :id AND {{tenant_filter}} AND {{live}}
    FOR UPDATE
), upd AS (
    UPDATE scheduled_jobs s
    SET status = 'cancelled', version = s.version + 1,
        updated_at = statement_timestamp(), finished_at = statement_timestamp()
    FROM cur
    WHERE s.id = :id AND s.id = cur.id
    RETURNING s.id, s.tenant, s.version, s.queue, cur.queue_job_id
), event AS (
    INSERT INTO scheduled_job_events (schedule_id, tenant, kind, version)
    SELECT id, tenant, 'cancelled', version FROM upd
)
SELECT queue_job_id, queue FROM upd

-- name: retry
-- A failed or cancelled schedule scheduled again as version + 1: attempts from zero, due at
-- the new time, its `rescheduled` event marked as a retry. Nothing for any other status.
WITH cur AS (
    SELECT id, run_at AS old_run_at, version AS old_version, status AS old_status
    FROM scheduled_jobs
    WHERE id = :id AND {{tenant_filter}} AND status IN ('failed', 'cancelled')
    FOR UPDATE
), upd AS (
    UPDATE scheduled_jobs s
    SET run_at = {{run_at}},
        due_at = {{run_at}} + s.jitter_offset,
        timezone = COALESCE(CAST(:timezone AS text), s.timezone),
        local_run_at = :local_run_at,
        version = s.version + 1,
        status = 'scheduled',
        queue_job_id = NULL,
        attempts = 0,
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
    INSERT INTO scheduled_job_events (schedule_id, tenant, kind, version, detail)
    SELECT id, tenant, 'rescheduled', version,
           jsonb_build_object('retry', true, 'old_status', old_status,
                              'old_run_at', {{utc(old_run_at)}}, 'new_run_at', {{utc(run_at)}},
                              'old_version', old_version)
    FROM upd
)
SELECT {{schedule_columns}} FROM upd

-- name: history
SELECT id, schedule_id, kind, version, at, detail FROM scheduled_job_events
WHERE schedule_id = :id AND {{tenant_filter}} ORDER BY id

-- name: history_newest
-- A page of a schedule's events, newest first, before the event id :before (the primary
-- key (schedule_id, id) serves it, however long the history).
SELECT id, schedule_id, kind, version, at, detail FROM scheduled_job_events
WHERE schedule_id = :id AND {{tenant_filter}} AND (CAST(:before AS bigint) IS NULL OR id < :before)
ORDER BY id DESC LIMIT :limit

-- name: attempts
-- A schedule's attempts, every version's, in the order they started.
SELECT version, attempt, status, worker, started_at, finished_at, next_attempt_at, error
FROM scheduled_job_attempts
WHERE schedule_id = :id AND {{tenant_filter}}
ORDER BY version, attempt

-- name: attempts_newest
-- A schedule's latest attempts, newest first.
SELECT version, attempt, status, worker, started_at, finished_at, next_attempt_at, error
FROM scheduled_job_attempts
WHERE schedule_id = :id AND {{tenant_filter}}
ORDER BY version DESC, attempt DESC LIMIT :limit

-- name: is_past_run_at
SELECT run_at <= statement_timestamp() AS past FROM scheduled_jobs
WHERE id = :id AND {{tenant_filter}}

-- name: database_now
SELECT statement_timestamp() AS now

-- name: backend_pid
-- The server process of this session: a pooler's connection reports another (store.connecting).
SELECT pg_backend_pid() AS pid

-- name: advisory_lock
SELECT pg_advisory_xact_lock(:key)
