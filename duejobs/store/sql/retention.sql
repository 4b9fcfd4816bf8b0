-- Retention: finished schedules deleted with their history, in batches.

-- name: prune_finished
WITH old AS (
    SELECT id FROM scheduled_jobs
    WHERE status IN ('succeeded', 'failed', 'cancelled')
      AND finished_at < statement_timestamp() - CAST(:age AS interval)
      -- partitioned mode: the range the horizon falls in is left whole for its drop
      AND (id < CAST(:wait_from AS uuid) OR id >= CAST(:wait_to AS uuid))
    ORDER BY finished_at
    LIMIT :limit
    FOR UPDATE SKIP LOCKED
-- Their history is deleted here: events carry no foreign key (migration 0003), and in
-- partitioned mode neither do attempts, results and effects (duejobs/store/partitions.py).
), events AS (
    DELETE FROM scheduled_job_events WHERE schedule_id = ANY(ARRAY(SELECT id FROM old))
), attempts AS (
    DELETE FROM scheduled_job_attempts WHERE schedule_id = ANY(ARRAY(SELECT id FROM old))
), results AS (
    DELETE FROM scheduled_job_results WHERE schedule_id = ANY(ARRAY(SELECT id FROM old))
), effects AS (
    DELETE FROM scheduled_job_effects WHERE schedule_id = ANY(ARRAY(SELECT id FROM old))
)
DELETE FROM scheduled_jobs WHERE id = ANY(ARRAY(SELECT id FROM old))
