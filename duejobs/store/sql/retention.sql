-- Retention: finished schedules deleted with their history, in batches.

-- name: prune_finished
WITH old AS (
    SELECT id FROM scheduled_jobs
    WHERE {{prunable}}
    ORDER BY finished_at
    LIMIT :limit
    FOR UPDATE SKIP LOCKED
), {{delete_history(old)}}
DELETE FROM scheduled_jobs WHERE id = ANY(ARRAY(SELECT id FROM old))

-- name: prune_finished_within
-- Partitioned mode: the same, within one span of ids (duejobs.services.partition_maintenance.batch_spans), so
-- the plan reads only the partitions in it. Run with custom plans only (retention.py): a
-- generic plan would guess the span narrow and read it through the primary key.
WITH old AS (
    SELECT id FROM scheduled_jobs
    WHERE {{prunable}} AND id BETWEEN CAST(:low AS uuid) AND CAST(:high AS uuid)
    ORDER BY finished_at
    LIMIT :limit
    FOR UPDATE SKIP LOCKED
), {{delete_history(old)}}
DELETE FROM scheduled_jobs WHERE id = ANY(ARRAY(SELECT id FROM old))

-- name: custom_plans_only
SELECT set_config('plan_cache_mode', 'force_custom_plan', true)
