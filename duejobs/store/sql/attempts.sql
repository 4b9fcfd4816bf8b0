-- A worker's attempt: claim, lease, effect ledger, finish, stale and deferred records.

-- name: claim_run
-- Turn a delivery into a running attempt, or say why not, in one statement: the skip
-- verdict (the attempt must be the next one of a scheduled row), then the database clock
-- (not due yet, or past its expiry). Skips other than not_due are recorded as events.
WITH cur AS (
    SELECT id, tenant, type, version, status, attempts, run_at, due_at, payload,
           expires_after
    FROM scheduled_jobs
    WHERE id = :id AND tenant = :tenant
    FOR UPDATE
), verdict AS (
    SELECT cur.*,
           COALESCE({{skip_verdict}},
                    CASE WHEN due_at > statement_timestamp() THEN 'not_due'
                         WHEN due_at + expires_after < statement_timestamp() THEN 'expired'
                    END) AS reason
    FROM cur
), upd AS (
    UPDATE scheduled_jobs s
    SET status = 'running', attempts = :attempt, started_at = statement_timestamp(),
        lease_expires_at = statement_timestamp() + CAST(:lease AS interval),
        updated_at = statement_timestamp()
    FROM verdict v
    WHERE s.id = :id AND s.id = v.id AND v.reason IS NULL
    RETURNING s.id, s.tenant, s.version, s.due_at, s.run_at, s.type
), attempt AS (
    INSERT INTO scheduled_job_attempts (schedule_id, tenant, version, attempt, status, worker)
    SELECT id, tenant, version, :attempt, 'running', :worker FROM upd
), event AS (
    INSERT INTO scheduled_job_events (schedule_id, tenant, kind, version, detail)
    SELECT id, tenant, 'started', version,
           jsonb_build_object(
               'attempt', :attempt, 'worker', :worker, 'type', type,
               'lag_ms', round(extract(epoch FROM statement_timestamp() - due_at) * 1000))
    FROM upd
    UNION ALL
    SELECT id, tenant, 'skipped', version,
           jsonb_build_object('reason', reason, 'delivered_version', :version,
                              'attempt', :attempt, 'worker', :worker)
    FROM verdict
    WHERE reason IN ('cancelled', 'superseded', 'duplicate', 'expired')
)
SELECT type, payload, run_at, due_at, reason, statement_timestamp() AS db_now FROM verdict

-- name: record_deferred
-- An early delivery put back for its due time: no attempt used, the history says so.
INSERT INTO scheduled_job_events (schedule_id, tenant, kind, version, detail)
SELECT id, tenant, 'requeued', version,
       jsonb_build_object('reason', 'not_due', 'due_at', due_at, 'attempt', :attempt)
FROM scheduled_jobs
WHERE id = :id AND version = :version AND status = 'scheduled'

-- name: expire
UPDATE scheduled_jobs SET status = 'cancelled', version = version + 1,
       finished_at = statement_timestamp(), updated_at = statement_timestamp(),
       last_error = 'expired: due ' || due_at || ', allowed ' || expires_after || ' late'
WHERE id = :id AND version = :version AND status = 'scheduled'

-- name: change_since_claim
-- The skip verdict of a running attempt (NULL while it is the current one).
SELECT {{skip_verdict}} AS reason FROM scheduled_jobs WHERE id = :id

-- name: change_since_claim_locked
-- The same, keeping the row locked to the end of the transaction (the effect fence).
SELECT {{skip_verdict}} AS reason FROM scheduled_jobs WHERE id = :id FOR UPDATE

-- name: extend_leases
-- Push forward the leases of the running attempts given, in one statement. A row locked by
-- its own handler's ctx.transaction() (or by an application) is skipped this beat, never
-- waited for: the reconciler's rescue skips locked rows too.
UPDATE scheduled_jobs s
SET lease_expires_at = statement_timestamp() + CAST(:lease AS interval)
FROM (
    SELECT j.id
    FROM unnest(CAST(:ids AS uuid[]), CAST(:versions AS integer[]),
                CAST(:attempts AS integer[])) AS r(id, version, attempt)
    JOIN scheduled_jobs j ON j.id = r.id AND j.version = r.version AND j.attempts = r.attempt
    WHERE j.status = 'running'
    ORDER BY j.id
    FOR UPDATE OF j SKIP LOCKED
) AS mine
WHERE s.id = mine.id

-- name: record_effect
INSERT INTO scheduled_job_effects (effect_key, schedule_id, tenant, version)
VALUES (:key, :id, :tenant, :version) ON CONFLICT (effect_key) DO NOTHING
RETURNING 1

-- name: finish
-- Close the running attempt: succeeded, failed, or back to scheduled for a retry (run_at
-- never moves; due_at carries the next attempt's time), with its attempt row and event.
WITH upd AS (
    UPDATE scheduled_jobs
    SET status = CAST(:status AS text),
        due_at = CASE WHEN CAST(:retry_in AS interval) IS NULL THEN due_at
                      ELSE statement_timestamp() + CAST(:retry_in AS interval) END,
        queue_job_id = CASE WHEN :status = 'scheduled' THEN NULL ELSE queue_job_id END,
        finished_at = CASE WHEN :status = 'scheduled' THEN NULL
                           ELSE statement_timestamp() END,
        last_error = CAST(:error AS text),
        lease_expires_at = NULL,
        updated_at = statement_timestamp()
    WHERE id = :id AND version = :version AND attempts = :attempt AND status = 'running'
    RETURNING id, tenant, version, due_at
), attempt AS (
    UPDATE scheduled_job_attempts a
    SET status = CASE WHEN :status = 'succeeded' THEN 'succeeded' ELSE 'failed' END,
        finished_at = statement_timestamp(), error = CAST(:error AS text),
        next_attempt_at = CASE WHEN :status = 'scheduled' THEN upd.due_at END
    FROM upd
    WHERE a.schedule_id = upd.id AND a.version = upd.version AND a.attempt = :attempt
)
INSERT INTO scheduled_job_events (schedule_id, tenant, kind, version, detail)
SELECT id, tenant, CAST(:event AS text), version,
       jsonb_strip_nulls(jsonb_build_object(
           'attempt', :attempt, 'error', CAST(:error AS text),
           'next_attempt_at', CASE WHEN :status = 'scheduled' THEN due_at END))
FROM upd
RETURNING 1

-- name: record_stale
-- A running attempt whose schedule moved on: its result is not applied, the history says so.
WITH att AS (
    UPDATE scheduled_job_attempts
    SET status = 'stale', finished_at = statement_timestamp(), error = :reason
    WHERE schedule_id = :id AND version = :version AND attempt = :attempt
      AND status = 'running'
    RETURNING schedule_id, tenant
)
INSERT INTO scheduled_job_events (schedule_id, tenant, kind, version, detail)
SELECT schedule_id, tenant, 'skipped', :version,
       jsonb_build_object('reason', :reason, 'attempt', :attempt, 'while', 'running')
FROM att

-- name: bookkeeping_session
-- A worker's bookkeeping connection: it gives up on a row lock an application holds after
-- :lock_timeout, and its commits wait for the WAL flush only with durable bookkeeping.
SELECT set_config('lock_timeout', :lock_timeout, false) AS lock_timeout,
       set_config('synchronous_commit', :synchronous_commit, false) AS synchronous_commit

-- name: bounded_locks
-- This transaction gives up on a row lock after a second (the heartbeat's and the
-- watchdog's statements must not hang behind a handler's own effect transaction).
SELECT set_config('lock_timeout', '1s', true)
