-- Observability figures: live counts, recent activity, outcomes and lag.

-- name: live_figures
-- Counts over live rows only (two partial-index scans), overall, per tenant, per type. Rows
-- due that wait unpushed under a rate limit holding the scheduler back now (:limited_queues,
-- :limited_tenants) are not overdue: the scheduler pushes them at the limit's pace, and the
-- query waiting_on_limits counts them.
WITH live AS (
    SELECT tenant, type, status, due_at, queue_job_id IS NOT NULL AS pushed,
           queue_job_id IS NULL AND (queue = ANY(CAST(:limited_queues AS text[]))
               OR tenant = ANY(CAST(:limited_tenants AS text[]))) AS paced
    FROM /*schema*/scheduled_jobs WHERE status = 'scheduled'
        AND (CAST(:tenant AS text) IS NULL OR tenant = :tenant)
    UNION ALL
    SELECT tenant, type, status, due_at, false, false FROM /*schema*/scheduled_jobs
    WHERE status = 'running' AND (CAST(:tenant AS text) IS NULL OR tenant = :tenant)
)
SELECT CASE WHEN GROUPING(tenant) = 0 THEN tenant END AS tenant,
       CASE WHEN GROUPING(type) = 0 THEN type END AS type,
       count(*) FILTER (WHERE status = 'scheduled') AS scheduled,
       count(*) FILTER (WHERE status = 'running') AS running,
       count(*) FILTER (WHERE status = 'scheduled' AND NOT paced
                        AND due_at <= statement_timestamp()) AS overdue,
       count(*) FILTER (WHERE status = 'scheduled' AND NOT paced
                        AND due_at < statement_timestamp() - CAST(:late AS interval))
           AS late,
       min(due_at) FILTER (WHERE status = 'scheduled' AND NOT paced
                           AND due_at <= statement_timestamp()) AS oldest_overdue,
       count(*) FILTER (WHERE pushed) AS pushed
FROM live
GROUP BY GROUPING SETS ((), (tenant), (type))

-- name: activity
-- Events of the last SINCE by kind (and, of the requeued, those put back for a type the
-- worker had no handler for), and the lag from due time to start, overall, per tenant and
-- per type; only that window of the history is read (BRIN index on time).
SELECT GROUPING(tenant, detail->>'type') AS level,
       CASE WHEN GROUPING(tenant) = 0 THEN tenant END AS tenant,
       CASE WHEN GROUPING(detail->>'type') = 0 THEN detail->>'type' END AS type,
       count(*) FILTER (WHERE kind = 'created') AS created,
           count(*) FILTER (WHERE kind = 'rescheduled') AS rescheduled,
           count(*) FILTER (WHERE kind = 'cancelled') AS cancelled,
           count(*) FILTER (WHERE kind = 'enqueued') AS enqueued,
           count(*) FILTER (WHERE kind = 'started') AS started,
           count(*) FILTER (WHERE kind = 'skipped') AS skipped,
           count(*) FILTER (WHERE kind = 'retried') AS retried,
           count(*) FILTER (WHERE kind = 'succeeded') AS succeeded,
           count(*) FILTER (WHERE kind = 'failed') AS failed,
           count(*) FILTER (WHERE kind = 'requeued') AS requeued,
           count(*) FILTER (WHERE kind = 'abandoned') AS abandoned,
           count(*) FILTER (WHERE kind = 'quarantined') AS quarantined,
       count(*) FILTER (WHERE kind = 'requeued' AND detail ->> 'reason' = 'unknown_type')
           AS unknown_type,
       percentile_cont(ARRAY[0.5, 0.95, 0.99]) WITHIN GROUP
           (ORDER BY CAST(detail->>'lag_ms' AS double precision))
           FILTER (WHERE kind = 'started') AS lag,
       max(CAST(detail->>'lag_ms' AS double precision)) FILTER (WHERE kind = 'started')
           AS lag_max
FROM /*schema*/scheduled_job_events
WHERE at >= statement_timestamp() - CAST(:since AS interval)
    AND (CAST(:tenant AS text) IS NULL OR tenant = :tenant)
GROUP BY GROUPING SETS ((), (tenant), (detail->>'type'))

-- name: lag_series
-- The start lag of the last SINCE in buckets of STEP: p50 and p99 of each bucket's starts
-- (only that window of the history is read, as for activity).
SELECT to_timestamp(floor(extract(epoch FROM at) / :step) * :step) AS bucket,
       count(*) AS starts,
       percentile_cont(ARRAY[0.5, 0.99]) WITHIN GROUP
           (ORDER BY CAST(detail->>'lag_ms' AS double precision)) AS lag
FROM /*schema*/scheduled_job_events
WHERE kind = 'started' AND at >= statement_timestamp() - CAST(:since AS interval)
  AND (CAST(:tenant AS text) IS NULL OR tenant = :tenant)
GROUP BY 1 ORDER BY 1

-- name: recurring_behind
-- Active recurring definitions whose next occurrence is past by more than LATE_AFTER and not
-- yet a row: the scheduler's recurring loop is not running, or failing, or behind.
SELECT count(*) AS behind FROM /*schema*/recurring_schedules
WHERE status = 'active' AND next_run_at < statement_timestamp() - CAST(:late_after AS interval)
  AND (CAST(:tenant AS text) IS NULL OR tenant = :tenant)

-- name: status_counts
SELECT status, count(*) AS n FROM /*schema*/scheduled_jobs
WHERE id = ANY(CAST(:ids AS uuid[])) GROUP BY status

-- name: outcomes
SELECT s.id, s.status, s.version, s.attempts,
       (SELECT count(*) FROM /*schema*/scheduled_job_effects f WHERE f.schedule_id = s.id) AS
           effects,
       (SELECT count(*) FROM /*schema*/scheduled_job_events e
        WHERE e.schedule_id = s.id AND e.kind = 'started') AS starts,
       (SELECT count(*) FROM /*schema*/scheduled_job_events e
        WHERE e.schedule_id = s.id AND e.kind = 'started' AND e.at < s.run_at) AS early,
       (SELECT min(e.version) FROM /*schema*/scheduled_job_events e
        WHERE e.schedule_id = s.id AND e.kind = 'started') AS started_version
FROM /*schema*/scheduled_jobs s WHERE s.id = ANY(CAST(:ids AS uuid[]))

-- name: start_lag
SELECT percentile_cont(ARRAY[0.5, 0.99]) WITHIN GROUP
           (ORDER BY CAST(detail->>'lag_ms' AS double precision)) AS lag
FROM /*schema*/scheduled_job_events WHERE kind = 'started'
    AND schedule_id = ANY(CAST(:ids AS uuid[]))

-- name: wal_position
-- Where the primary's write-ahead log ends now, records not yet written included (an
-- asynchronous commit is visible before it is written): a replica that has replayed this
-- far has every transaction committed before this statement.
SELECT CAST(pg_current_wal_insert_lsn() AS text) AS lsn

-- name: bound_statements
-- The time limit of each statement left in this transaction (an operator's read: a filter
-- that finds no index, a lock held by a migration, must not run unbounded), and of its waits
-- for a lock (:lock_ms, shorter: a read stopped behind a lock says so).
-- A shorter lock limit already in force (the role's, a caller's transaction's) is kept.
SELECT current_setting('statement_timeout') AS before,
       current_setting('lock_timeout') AS lock_before,
       set_config('statement_timeout', :ms, true) AS statement_timeout,
       set_config('lock_timeout',
                  CASE WHEN current_setting('lock_timeout') <> '0'
                        AND CAST(current_setting('lock_timeout') AS interval)
                            < CAST(:lock_ms || ' ms' AS interval)
                       THEN current_setting('lock_timeout') ELSE :lock_ms END,
                  true) AS lock_timeout

-- name: restore_statement_timeout
SELECT set_config('statement_timeout', :before, true) AS statement_timeout,
       set_config('lock_timeout', :lock_before, true) AS lock_timeout

-- name: replay_position
-- How far a replica has replayed: whether it has reached :lsn (read from the primary just
-- before), and how long ago the last transaction it replayed was committed.
SELECT pg_is_in_recovery() AS in_recovery,
       COALESCE(pg_last_wal_replay_lsn() >= CAST(:lsn AS pg_lsn), false) AS caught_up,
       statement_timestamp() - pg_last_xact_replay_timestamp() AS behind

-- name: table_figures
-- Each of duejobs' tables that exists in its schema, a partitioned table's partitions summed
-- under the table's name: its size with indexes and TOAST, its indexes' size, its live and dead
-- tuples (the statistics collector's counts) and when autovacuum last finished on it.
SELECT coalesce(parent.relname, c.relname) AS name,
       sum(pg_total_relation_size(c.oid)) AS bytes,
       sum(pg_indexes_size(c.oid)) AS index_bytes,
       coalesce(sum(s.n_live_tup), 0) AS live,
       coalesce(sum(s.n_dead_tup), 0) AS dead,
       max(s.last_autovacuum) AS last_autovacuum
FROM pg_catalog.pg_class c
JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
LEFT JOIN pg_catalog.pg_inherits i ON i.inhrelid = c.oid
LEFT JOIN pg_catalog.pg_class parent ON parent.oid = i.inhparent
LEFT JOIN pg_catalog.pg_stat_all_tables s ON s.relid = c.oid
WHERE c.relkind = 'r'
  AND n.nspname = :schema
  AND coalesce(parent.relname, c.relname) = ANY(CAST(:tables AS text[]))
GROUP BY 1
ORDER BY 1
