-- Testing users' handlers (duejobs.testing): time moved forward for the schedules, and a
-- fresh start between two tests.

-- name: advance_live
-- Every live schedule's times moved earlier by :by, which is to duejobs what the clock
-- moving forward by :by is: due times, intended times and the leases of running attempts.
UPDATE /*schema*/scheduled_jobs
SET run_at = run_at - CAST(:by AS interval),
    due_at = due_at - CAST(:by AS interval),
    lease_expires_at = lease_expires_at - CAST(:by AS interval)
WHERE status IN ('scheduled', 'running')

-- name: next_due_in
-- How long until the next live schedule is due by the database clock (NULL: none is).
SELECT min(due_at) - statement_timestamp() AS wait FROM /*schema*/scheduled_jobs WHERE status =
    'scheduled'

-- name: empty_tables
-- Every schedule, its history and every definition, quota and rate limit gone: a test starts afresh.
TRUNCATE /*schema*/scheduled_jobs, /*schema*/scheduled_job_events,
    /*schema*/scheduled_job_attempts, /*schema*/scheduled_job_effects,
    /*schema*/scheduled_job_results, /*schema*/recurring_schedules, /*schema*/tenant_quotas,
    /*schema*/rate_limits

-- name: empty_keys
-- Partitioned mode's table of live keys, emptied with the rest.
TRUNCATE /*schema*/scheduled_job_keys
