-- Schedules many at a time: a binary COPY, keyed rows through a staging table.

-- name: create_staging
-- Keyed rows of a batch wait here to be moved (emptied after each batch). Dropped at the
-- commit: nothing of it stays on a session a pooler hands on.
CREATE TEMPORARY TABLE IF NOT EXISTS duejobs_staging (
    ord integer, id uuid, tenant text, type text, key text, payload text,
    run_at timestamptz, delay interval, jitter_offset interval, expires_after interval,
    max_attempts integer, timezone text, local_run_at timestamp, queue text, priority smallint
) ON COMMIT DROP

-- name: move_staged
-- The staged rows into the table (database clock for delays, keys held by a live schedule
-- skipped), with their `created` events; how many were created.
WITH new AS (
    INSERT INTO /*schema*/scheduled_jobs
        (id, tenant, type, key, payload, run_at, due_at, jitter_offset, expires_after,
         max_attempts, timezone, local_run_at, queue, priority)
    SELECT id, tenant, type, key, CAST(payload AS jsonb), at, at + jitter_offset,
           jitter_offset, expires_after, max_attempts, timezone, local_run_at, queue, priority
    -- a key twice in the batch: its first row
    FROM (SELECT DISTINCT ON (tenant, key) *, COALESCE(run_at, statement_timestamp() + delay) AS at
          FROM duejobs_staging ORDER BY tenant, key, ord) AS staged
    -- the key is held by a live schedule: as insert_schedule says
    WHERE NOT EXISTS (SELECT 1 FROM /*schema*/scheduled_jobs holder WHERE holder.tenant =
        staged.tenant AND holder.key = staged.key AND holder.status IN ('scheduled', 'running'))
    ORDER BY ord
    ON CONFLICT DO NOTHING
    RETURNING id, tenant, version, run_at, due_at, timezone, local_run_at, key
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
SELECT count(*) AS created FROM new

-- name: staged_keys
-- Which live schedule holds each staged key (the new one, or the one that already held it).
SELECT st.ord, s.id FROM duejobs_staging st JOIN /*schema*/scheduled_jobs s
ON s.tenant = st.tenant AND s.key = st.key AND status IN ('scheduled', 'running')
WHERE st.key IS NOT NULL

-- name: clear_staging
-- A second batch in one transaction starts empty.
TRUNCATE duejobs_staging

-- name: record_copied
-- The `created` events of a batch just copied. Its ids were drawn in increasing order, so
-- its rows are those between its first and last id that carry this (sub)transaction's xid:
-- a row another transaction wrote in that range carries another xid, and has its own event.
INSERT INTO /*schema*/scheduled_job_events (schedule_id, tenant, kind, version, detail)
SELECT id, tenant, 'created', version, CASE WHEN timezone IS NULL AND local_run_at IS NULL
    AND key IS NULL AND due_at = run_at THEN jsonb_build_object('run_at',
    (to_jsonb(CAST(run_at AS timestamptz) AT TIME ZONE 'UTC') #>> '{}') || '+00:00')
    ELSE jsonb_strip_nulls(jsonb_build_object('run_at',
    (to_jsonb(CAST(run_at AS timestamptz) AT TIME ZONE 'UTC') #>> '{}') || '+00:00', 'timezone',
    timezone, 'local_run_at', local_run_at, 'key', key, 'due_at',
    (to_jsonb(CAST(CASE
    WHEN due_at <> run_at THEN due_at END AS timestamptz) AT TIME ZONE 'UTC') #>> '{}') ||
    '+00:00')) END
FROM /*schema*/scheduled_jobs
WHERE id BETWEEN :first AND :last
  AND xmin = (SELECT xmin FROM /*schema*/scheduled_jobs WHERE id = :first)
