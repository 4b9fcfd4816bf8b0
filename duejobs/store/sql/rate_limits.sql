-- Rate limits: at most N starts a period for a queue or a tenant (duejobs.store.rate_limits).
-- The worker's claim (claim_runs) grants the starts and keeps each limit's count.

-- name: hold_limit
-- A limit about to change, held from the scheduler's claims to the change's commit: waits for
-- a claim that is pacing it (pace_limits' lock; the tenants' default's, which every claim
-- pacing a tenant holds shared), so a claim's pointer, written at its end, is for the limit
-- as it was, and the change starting its count again comes after it.
SELECT pg_advisory_xact_lock(hashtext('duejobs-pace:' || CAST(:scope AS text) || ':'
                                      || CAST(:name AS text)))

-- name: set_rate_limit
-- A queue's limit, a tenant's own, or the tenants' default (tenant '*'), with the interval
-- between starts at its rate (:every, rounded up to the microsecond); a changed limit's count
-- starts again, so a limit raised is in force at the next start, not once the old pace has
-- caught up. The same limit set again changes nothing (returns no row): a count started
-- again grants its tolerance at once, so a limit applied over and over (a deploy's
-- configuration) would otherwise let more than N + 1 start in a period.
INSERT INTO /*schema*/rate_limits AS l (scope, name, max_starts, period, every)
VALUES (:scope, :name, :max_starts, :period, :every)
ON CONFLICT (scope, name) DO UPDATE
SET max_starts = EXCLUDED.max_starts, period = EXCLUDED.period, every = EXCLUDED.every,
    started_until = NULL, paced_until = NULL, window_start = NULL, window_starts = 0,
    previous_starts = 0, updated_at = statement_timestamp()
WHERE (l.max_starts, l.period) IS DISTINCT FROM (EXCLUDED.max_starts, EXCLUDED.period)
RETURNING l.scope

-- name: restart_default_counts
-- The tenants' default changed or cleared: the counts of the tenants that follow it start
-- again too.
UPDATE /*schema*/rate_limits
SET started_until = NULL, paced_until = NULL, window_start = NULL, window_starts = 0,
    previous_starts = 0, updated_at = statement_timestamp()
WHERE scope = 'tenant' AND max_starts IS NULL

-- name: clear_rate_limit
-- A limit cleared, with its count: a tenant follows the default again (a count of its own
-- made afresh at its next start). A tenant's count that follows the default is no limit set:
-- left alone. Returns the row cleared, if any.
DELETE FROM /*schema*/rate_limits
WHERE scope = :scope AND name = :name AND max_starts IS NOT NULL
RETURNING scope

-- name: rate_limits
-- The limits set — queues first, then the tenants' default, then tenants by name — and the
-- counts of the tenants that follow the default whose count window began within the last two
-- periods; each with its last grant and its starts over the last period, by the database
-- clock. Those starts are estimated from the count's two fixed windows of one period
-- (claim_runs keeps them): the current window's, plus the window before's weighted by the
-- share of it the sliding period still covers, rounded — right, to the rounding, when starts
-- come evenly; off by at most the unevenness of the window before otherwise. They may pass
-- N: a limit lets N + 1 start in a period. No read of the history.
SELECT l.scope, l.name, l.max_starts IS NULL AS follows_default,
       COALESCE(l.max_starts, d.max_starts) AS max_starts,
       COALESCE(l.period, d.period) AS period, l.asked, l.granted, l.started_until,
       l.paced_until,
       CAST(round(CASE WHEN l.scope = 'tenant' AND l.name = '*' THEN NULL  -- each its own
            WHEN l.window_start IS NULL THEN 0
            WHEN e.elapsed < 1 THEN l.window_starts + l.previous_starts * (1 - e.elapsed)
            WHEN e.elapsed < 2 THEN l.window_starts * (2 - e.elapsed)
            ELSE 0 END) AS integer) AS recent_starts
FROM /*schema*/rate_limits l
LEFT JOIN /*schema*/rate_limits d
    ON l.max_starts IS NULL AND d.scope = 'tenant' AND d.name = '*'
CROSS JOIN LATERAL (
    SELECT extract(epoch FROM statement_timestamp() - l.window_start)
           / extract(epoch FROM COALESCE(l.period, d.period)) AS elapsed
) AS e
WHERE COALESCE(l.max_starts, d.max_starts) IS NOT NULL
  AND (l.max_starts IS NOT NULL OR e.elapsed < 2)
ORDER BY l.scope, l.max_starts IS NULL, l.name <> '*', l.name

-- name: prune_rate_counts
-- The counts of tenants that follow the default and have started nothing for a while: their
-- next start's time, by the worker's grant and the scheduler's pace, is in the past (a count
-- made and never used: since it was made), so a count made afresh at their next start grants
-- exactly what this one would; and whose starts no longer count in their use (a window begun
-- more than two of the default's periods ago: an hourly default's count is kept two hours).
-- Rows a claim holds are skipped (next pass), and never waited for: no deadlock with the
-- claims, which lock them in (scope, name) order.
DELETE FROM /*schema*/rate_limits
WHERE (scope, name) IN (
    SELECT scope, name FROM /*schema*/rate_limits
    WHERE max_starts IS NULL
      AND COALESCE(GREATEST(started_until, paced_until), updated_at)
          < statement_timestamp() - CAST(:idle AS interval)
      AND (window_start IS NULL OR window_start + 2 * COALESCE(
               (SELECT period FROM /*schema*/rate_limits WHERE scope = 'tenant' AND name = '*'),
               interval '0') < statement_timestamp())
    FOR UPDATE SKIP LOCKED)

-- name: waiting_on_limits
-- Rows waiting on a rate limit, overall, per queue and per tenant, with the earliest due time
-- they had before it: those given a start's time ahead (scheduled, their job in the scheduled
-- registry, a put-back of this attempt for a limit: by the scheduler's pace or a worker's
-- turn-back), and those due that wait unpushed in the table under a limit set (:limited_queues,
-- :limited_tenants: those whose limits hold the scheduler back now) for the pace to give them
-- a start.
-- Either shows here, not among the overdue.
WITH waiting AS (
    SELECT s.queue, s.tenant, w.since
    FROM /*schema*/scheduled_jobs s
    CROSS JOIN LATERAL (
        SELECT min(CAST(e.detail ->> 'moved_from' AS timestamptz)) AS since
        FROM /*schema*/scheduled_job_events e
        WHERE e.schedule_id = s.id AND e.version = s.version AND e.kind = 'requeued'
          AND e.detail ->> 'reason' = 'rate_limited'
          AND e.detail ->> 'attempt' = CAST(s.attempts + 1 AS text)
    ) AS w
    WHERE s.status = 'scheduled' AND s.queue_job_id IS NOT NULL
      AND s.due_at > statement_timestamp() AND w.since IS NOT NULL
      AND (CAST(:tenant AS text) IS NULL OR s.tenant = :tenant)
      AND EXISTS (SELECT 1 FROM /*schema*/rate_limits)
    UNION ALL
    SELECT s.queue, s.tenant, s.due_at
    FROM /*schema*/scheduled_jobs s
    WHERE s.status = 'scheduled' AND s.queue_job_id IS NULL
      AND s.due_at <= statement_timestamp()
      AND (s.queue = ANY(CAST(:limited_queues AS text[]))
           OR s.tenant = ANY(CAST(:limited_tenants AS text[])))
      AND (CAST(:tenant AS text) IS NULL OR s.tenant = :tenant)
)
SELECT CASE WHEN GROUPING(queue) = 0 THEN queue END AS queue,
       CASE WHEN GROUPING(tenant) = 0 THEN tenant END AS tenant,
       count(*) AS waiting, min(since) AS since
FROM waiting
GROUP BY GROUPING SETS ((), (queue), (tenant))
