-- Retention: finished schedules deleted with their history, in batches.

-- name: prune_finished
WITH old AS (
    SELECT id FROM /*schema*/scheduled_jobs
    WHERE status IN ('succeeded', 'failed', 'cancelled')
        AND finished_at < statement_timestamp() - CAST(:age AS interval)
    ORDER BY finished_at
    LIMIT :limit
    FOR UPDATE SKIP LOCKED
), events AS (DELETE FROM /*schema*/scheduled_job_events WHERE schedule_id = ANY(ARRAY(SELECT id
    FROM old))), attempts AS (DELETE FROM /*schema*/scheduled_job_attempts WHERE schedule_id =
    ANY(ARRAY(SELECT id FROM old))),
    results AS (DELETE FROM /*schema*/scheduled_job_results WHERE schedule_id = ANY(ARRAY(SELECT id
    FROM old))), effects AS (DELETE FROM /*schema*/scheduled_job_effects WHERE schedule_id =
    ANY(ARRAY(SELECT id FROM old)))
DELETE FROM /*schema*/scheduled_jobs WHERE id = ANY(ARRAY(SELECT id FROM old))

-- name: prune_finished_within
-- Partitioned mode: the same, within one span of ids (duejobs.services.partition_maintenance.batch_spans), so
-- the plan reads only the partitions in it. Run with custom plans only (retention.py): a
-- generic plan would guess the span narrow and read it through the primary key.
WITH old AS (
    SELECT id FROM /*schema*/scheduled_jobs
    WHERE status IN ('succeeded', 'failed', 'cancelled')
        AND finished_at < statement_timestamp() - CAST(:age AS interval)
        AND id BETWEEN CAST(:low AS uuid) AND CAST(:high AS uuid)
    ORDER BY finished_at
    LIMIT :limit
    FOR UPDATE SKIP LOCKED
), events AS (DELETE FROM /*schema*/scheduled_job_events WHERE schedule_id = ANY(ARRAY(SELECT id
    FROM old))), attempts AS (DELETE FROM /*schema*/scheduled_job_attempts WHERE schedule_id =
    ANY(ARRAY(SELECT id FROM old))),
    results AS (DELETE FROM /*schema*/scheduled_job_results WHERE schedule_id = ANY(ARRAY(SELECT id
    FROM old))), effects AS (DELETE FROM /*schema*/scheduled_job_effects WHERE schedule_id =
    ANY(ARRAY(SELECT id FROM old)))
DELETE FROM /*schema*/scheduled_jobs WHERE id = ANY(ARRAY(SELECT id FROM old))

-- name: custom_plans_only
SELECT set_config('plan_cache_mode', 'force_custom_plan', true)
