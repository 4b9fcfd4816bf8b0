-- Retention: finished schedules deleted with their history, in batches.

-- name: prune_finished
WITH old AS (
    SELECT id FROM scheduled_jobs
    WHERE status IN ('succeeded', 'failed', 'cancelled')
      AND finished_at < statement_timestamp() - CAST(:age AS interval)
    ORDER BY finished_at
    LIMIT :limit
    FOR UPDATE SKIP LOCKED
), events AS (  -- events carry no foreign key (see migration 0003): delete them here
    DELETE FROM scheduled_job_events WHERE schedule_id = ANY(ARRAY(SELECT id FROM old))
)
DELETE FROM scheduled_jobs WHERE id = ANY(ARRAY(SELECT id FROM old))
