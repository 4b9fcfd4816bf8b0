-- Results: a task's return value and its attempts' errors, beside its schedule.

-- name: save_return_value
-- Inside the attempt's effect fence: the value commits with the schedule's success.
INSERT INTO /*schema*/scheduled_job_results (schedule_id, tenant, return_value)
VALUES (:id, :tenant, CAST(:value AS jsonb))
ON CONFLICT (schedule_id) DO UPDATE
SET return_value = EXCLUDED.return_value, updated_at = statement_timestamp()

-- name: add_error
INSERT INTO /*schema*/scheduled_job_results (schedule_id, tenant, errors)
VALUES (:id, :tenant, jsonb_build_array(CAST(:error AS jsonb)))
ON CONFLICT (schedule_id) DO UPDATE
SET errors = /*schema*/scheduled_job_results.errors || EXCLUDED.errors,
    updated_at = statement_timestamp()

-- name: outcome_of
-- A schedule's result row (if any) and its attempts, oldest first, in one round trip; a
-- tenant scope (:tenant not NULL) sees only its own.
SELECT r.return_value, r.errors,
       COALESCE((SELECT jsonb_agg(jsonb_build_object(
                          'worker', a.worker, 'status', a.status,
                          'started_at', (to_jsonb(CAST(a.started_at AS timestamptz) AT TIME ZONE
                              'UTC') #>> '{}') || '+00:00', 'finished_at',
                              (to_jsonb(CAST(a.finished_at AS timestamptz) AT TIME ZONE 'UTC') #>>
                              '{}') || '+00:00')
                        ORDER BY a.version, a.attempt)
                 FROM /*schema*/scheduled_job_attempts a
                 WHERE a.schedule_id = :id
                   AND (CAST(:tenant AS text) IS NULL OR a.tenant = :tenant)), '[]') AS attempts
FROM (SELECT 1) AS one
LEFT JOIN /*schema*/scheduled_job_results r
       ON r.schedule_id = :id AND (CAST(:tenant AS text) IS NULL OR r.tenant = :tenant)
