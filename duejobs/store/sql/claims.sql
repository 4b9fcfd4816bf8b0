-- The scheduler's claim: due rows shared fairly among tenants, under their in-flight caps.

-- name: claim_plan
-- For the claim's transaction (the walk, then the claim of the shares): no bitmap scan and no
-- sort where an index gives the order. Every read of the claim takes a tenant's rows in
-- (tenant, due_at) order, at most a batch of them, from the per-tenant index. On a partition
-- that holds most of the due rows (the current one, in partitioned mode) the planner otherwise
-- read a tenant's rows by bitmap, or its due_at index filtering out the other tenants', and
-- sorted them: the walk took 5x its time at a million rows (30 ms against 5.4 ms; the plain
-- schema's walk got faster too). Nor an incremental sort: a (tenant, queue) pair's rows read
-- from the per-tenant index and sorted by queue would read every row of the tenant. tests/test_partition_plans.py pins the plan.
-- And the generic plan from the first run of the walk and the shares (each prepared on its
-- connection, duejobs.store.claims): planning is most of the cost the partitioned mode adds,
-- every statement naming scheduled_jobs once per partition with each partition's twenty
-- indexes (8 ms for the walk over nine partitions against 1 ms plain, the walk running in
-- 1.4 ms). PostgreSQL on its own came to generic plans of the same shape, but only at a
-- statement's eleventh run on a connection (the driver prepares it at its sixth, then five
-- custom plans), and again after each invalidation (an ANALYZE of the table). A plan kept
-- is not made again as a partition fills: no sequential scan either, or a partition planned
-- empty (the one ahead, analyzed before its period began) would be read whole for each
-- tenant walked until autovacuum's next ANALYZE.
-- And no JIT: over a partitioned table the claim's estimated cost passes jit_above_cost, and at
-- ten million rows it spent ~160 ms compiling for each batch of 1,000, half its time.
-- All for this transaction alone: a pooled server session's next client sees none of it.
SELECT set_config('enable_bitmapscan', 'off', true) AS bitmapscan,
       set_config('jit', 'off', true) AS jit,
       set_config('enable_sort', 'off', true) AS sort,
       set_config('enable_incremental_sort', 'off', true) AS incremental_sort,
       set_config('enable_seqscan', 'off', true) AS seqscan,
       set_config('plan_cache_mode', 'force_generic_plan', true) AS plans

-- name: claim_walk
-- First half of a claim: walk the (tenant, queue) pairs that have rows waiting to be pushed, in
-- name order after a cursor, one index probe each (the recursion is evaluated only as far as
-- the LIMIT pulls it), and count each one's due rows up to the batch size. Pairs, not tenants,
-- so that the rows of a queue under a rate limit stay in the table without the claim reading
-- through them to reach the rows of the queues beside it. A pair under a rate limit (its
-- queue's, its tenant's own or the tenants' default) counts only the rows due within :horizon:
-- the scheduler pushes no more of them than the limit's pace has starts for by then
-- (duejobs.scheduler.pacing). A tenant is "sparse" when it has fewer than FRONT_LANE jobs
-- waiting in the queue. Capped tenants are locked (try-lock, held to the end of the claim's
-- transaction) so that two claims never both fill the same tenant's last places; their
-- in-flight count here is an estimate for sharing the batch, and the claim counts again under
-- the lock.
WITH RECURSIVE pairs (tenant, queue) AS (
    (SELECT s.tenant, s.queue FROM /*schema*/scheduled_jobs s
     WHERE s.status = 'scheduled' AND s.queue_job_id IS NULL
       AND (s.tenant, s.queue) > (CAST(:after_tenant AS text), CAST(:after_queue AS text))
       AND EXISTS (SELECT 1 FROM /*schema*/scheduled_jobs WHERE status = 'scheduled'
           AND queue_job_id IS NULL
                   AND due_at <= statement_timestamp() + CAST(:window AS interval))
     ORDER BY s.tenant, s.queue
     LIMIT 1)
  UNION ALL
    SELECT n.tenant, n.queue FROM pairs t CROSS JOIN LATERAL (
        SELECT s.tenant, s.queue FROM /*schema*/scheduled_jobs s
        WHERE s.status = 'scheduled' AND s.queue_job_id IS NULL
          AND (s.tenant, s.queue) > (t.tenant, t.queue)
        ORDER BY s.tenant, s.queue
        LIMIT 1) AS n
), capped AS (
    SELECT t.tenant, t.queue, COALESCE((SELECT max_inflight FROM /*schema*/tenant_quotas WHERE
        tenant = t.tenant), (SELECT max_inflight FROM /*schema*/tenant_quotas WHERE tenant = '*'))
        AS cap,
        (SELECT q.every FROM /*schema*/rate_limits q WHERE q.scope = 'queue' AND q.name = t.queue
            AND q.max_starts IS NOT NULL) AS queue_every,
        (SELECT CASE WHEN own.max_starts IS NOT NULL THEN own.every ELSE dflt.every END
         FROM (SELECT 1) AS one
         LEFT JOIN /*schema*/rate_limits own ON own.scope = 'tenant' AND own.name = t.tenant
         LEFT JOIN /*schema*/rate_limits dflt ON dflt.scope = 'tenant' AND dflt.name = '*'
         WHERE COALESCE(own.max_starts, dflt.max_starts) IS NOT NULL) AS tenant_every,
        -- when each limit's next start is due (the scheduler's pace, or the grant's if later)
        (SELECT GREATEST(q.paced_until, q.started_until) FROM /*schema*/rate_limits q
         WHERE q.scope = 'queue' AND q.name = t.queue) AS queue_next,
        (SELECT GREATEST(c.paced_until, c.started_until) FROM /*schema*/rate_limits c
         WHERE c.scope = 'tenant' AND c.name = t.tenant) AS tenant_next
    FROM pairs t
), ahead AS (
    SELECT c.*, CASE WHEN c.cap IS NOT NULL THEN interval '0'
                     WHEN c.queue_every IS NOT NULL OR c.tenant_every IS NOT NULL
                         THEN CAST(:horizon AS interval)
                     ELSE CAST(:window AS interval) END AS ahead,
           -- a pair whose limit has no start before the horizon: stepped past, not counted,
           -- so pairs waiting on their limits never fill a walk and hold up the pairs after
           COALESCE(c.queue_every IS NOT NULL
                        AND c.queue_next > statement_timestamp() + CAST(:horizon AS interval)
                    OR c.tenant_every IS NOT NULL
                        AND c.tenant_next > statement_timestamp() + CAST(:horizon AS interval),
                    false) AS blocked
    FROM capped c
), walked AS MATERIALIZED (  -- each pair's count once (inlined, it ran twice: filter, output)
    SELECT p.*,
           (SELECT count(*) FROM (
                SELECT 1 FROM /*schema*/scheduled_jobs s
                WHERE s.status = 'scheduled' AND s.queue_job_id IS NULL
                    AND (s.tenant, s.queue, s.due_at)
                        >= (p.tenant, p.queue, CAST('-infinity' AS timestamptz))
                    AND (s.tenant, s.queue, s.due_at)
                        <= (p.tenant, p.queue, statement_timestamp() + p.ahead)
                -- in the pairs' index order: on a partition holding most due rows the planner
                -- would otherwise read its due_at index and filter out the other pairs'
                ORDER BY s.tenant, s.queue, s.due_at
                LIMIT :limit) AS d WHERE NOT p.blocked) AS due
    FROM ahead p
), picked AS (
    SELECT * FROM walked WHERE due > 0 LIMIT :limit
)
SELECT statement_timestamp() AS db_now, p.tenant, p.queue, p.due, p.cap, p.ahead,
       p.queue_every, p.tenant_every,
       CASE WHEN p.cap IS NOT NULL
            THEN pg_try_advisory_xact_lock(hashtext('duejobs-inflight:' || p.tenant))
       END AS locked,
       CASE WHEN p.cap IS NOT NULL THEN ((SELECT count(*) FROM (SELECT 1 FROM
           /*schema*/scheduled_jobs WHERE tenant = p.tenant AND status = 'scheduled'
           AND queue_job_id IS NOT NULL LIMIT p.cap) AS pushed) + (SELECT count(*) FROM
           /*schema*/scheduled_jobs WHERE status = 'running'
           AND tenant = p.tenant)) END AS inflight,
       (SELECT count(*) FROM (
            SELECT 1 FROM /*schema*/scheduled_jobs s
            WHERE s.status = 'scheduled' AND s.queue_job_id IS NOT NULL
              AND (s.tenant, s.due_at) >= (p.tenant, CAST('-infinity' AS timestamptz))
                  AND (s.tenant, s.due_at) <= (p.tenant, statement_timestamp())
            -- in the pushed rows' index order: the planner, which cannot tell that most
            -- scheduled rows are unpushed, would otherwise filter them out of the due index
            ORDER BY s.tenant, s.due_at
            LIMIT :front_lane) AS queued) < :front_lane AS sparse
-- The claim's commit does not wait for the WAL flush: a worker that already popped a job
-- waits less on the row's lock (what a crash can cost: see duejobs.scheduler.loop).
FROM (SELECT set_config('synchronous_commit', 'off', true)) AS always
LEFT JOIN picked p ON true

-- name: claim_shares
-- Second half: take each (tenant, queue) pair's share of the batch — its due rows above
-- priority 0 first, then the oldest, within its :aheads (the walk's `ahead`) — FOR UPDATE SKIP
-- LOCKED (a capped tenant's shares cut to the room its cap leaves, counted afresh), record the
-- queue job ids and an `enqueued` event, and return the
-- rows in turns — every tenant's first row, then every tenant's second, each tenant's due rows
-- in priority then due order, then its later ones — so that the push interleaves tenants in
-- the queue as well.
WITH asked AS (
    SELECT * FROM unnest(CAST(:tenants AS text[]), CAST(:queues AS text[]),
                         CAST(:shares AS integer[]), CAST(:caps AS integer[]),
                         CAST(:aheads AS interval[]))
        WITH ORDINALITY AS a(tenant, queue, share, cap, ahead, ord)
), plan AS (
    -- A capped tenant's room, counted afresh under its lock, given to its pairs in order.
    SELECT a.tenant, a.queue, a.ahead,
           CASE WHEN a.cap IS NULL THEN a.share
                ELSE LEAST(a.share, GREATEST(0, a.cap - ((SELECT count(*) FROM (SELECT 1 FROM
                    /*schema*/scheduled_jobs WHERE tenant = a.tenant AND status = 'scheduled'
                    AND queue_job_id IS NOT NULL LIMIT a.cap) AS pushed) + (SELECT count(*) FROM
                    /*schema*/scheduled_jobs WHERE status = 'running'
                    AND tenant = a.tenant)) - COALESCE(sum(a.share) OVER (PARTITION BY a.tenant
                    ORDER BY a.ord ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING), 0)))
           END AS n
    FROM asked a
), due AS (
    -- Each tenant's share: its due rows above priority 0 first (the oldest, from their own
    -- small index: however many older rows of its wait, they never hold these up), then its
    -- others — the rest of its due rows and those due later in the window —, oldest first, read
    -- only for the room the first leave (the LIMIT stops pulling rows, and so locking them,
    -- once the share is full). Priority ranks due work: a row due in ten minutes never takes
    -- the place of one due now, whatever their priorities.
    SELECT c.id FROM plan p CROSS JOIN LATERAL (
        SELECT urgent.id FROM (
            SELECT s.id FROM /*schema*/scheduled_jobs s
            WHERE s.status = 'scheduled' AND s.queue_job_id IS NULL AND s.priority > 0
                AND (s.tenant, s.queue, s.due_at)
                    >= (p.tenant, p.queue, CAST('-infinity' AS timestamptz))
                AND (s.tenant, s.queue, s.due_at) <= (p.tenant, p.queue, statement_timestamp())
            ORDER BY s.tenant, s.queue, s.due_at
            LIMIT GREATEST(p.n, 0)
            FOR UPDATE SKIP LOCKED
        ) AS urgent
        UNION ALL
        SELECT other.id FROM (
            SELECT s.id FROM /*schema*/scheduled_jobs s
            WHERE s.status = 'scheduled' AND s.queue_job_id IS NULL
                AND (s.priority <= 0 OR s.due_at > statement_timestamp())
                AND (s.tenant, s.queue, s.due_at)
                    >= (p.tenant, p.queue, CAST('-infinity' AS timestamptz))
                AND (s.tenant, s.queue, s.due_at)
                    <= (p.tenant, p.queue, statement_timestamp() + p.ahead)
            ORDER BY s.tenant, s.queue, s.due_at
            LIMIT GREATEST(p.n, 0)
            FOR UPDATE SKIP LOCKED
        ) AS other
        LIMIT GREATEST(p.n, 0)
    ) AS c
), upd AS (
    UPDATE /*schema*/scheduled_jobs s
    SET queue_job_id = 'dj-' || replace(s.tenant, '.', '_') || '-' || replace(CAST(s.id AS text),
        '-', '') || '-v' || s.version || '-a' || (s.attempts + 1),
        enqueued_at = statement_timestamp(), updated_at = statement_timestamp()
    -- One primary-key lookup per claimed row (a nested loop over at most a batch), which in
    -- partitioned mode reads only that row's partition: `id = ANY(array)` would look every
    -- id up in every partition.
    FROM unnest(ARRAY(SELECT id FROM due)) AS d(id)
    WHERE s.id = d.id
    RETURNING s.id, s.tenant, s.version, s.attempts + 1 AS attempt, s.due_at,
              s.queue_job_id, s.queue, s.priority
), event AS (
    INSERT INTO /*schema*/scheduled_job_events (schedule_id, tenant, kind, version, detail)
    SELECT id, tenant, 'enqueued', version, jsonb_build_object('queue_job_id', queue_job_id)
    FROM upd
)
SELECT upd.*,
       row_number() OVER (PARTITION BY upd.tenant ORDER BY upd.due_at > statement_timestamp(),
                          upd.priority DESC, upd.due_at) AS turn
FROM upd
ORDER BY turn, upd.due_at > statement_timestamp(), upd.priority DESC, upd.due_at

-- name: pace_limits
-- The rate limits a claim paces its pairs under, with the scheduler's pointer and the worker's
-- grant (NULL: a tenant under the default with no count yet, paced from now), held by this
-- claim alone: a transaction-scoped try-lock per limit (a limit another claim is pacing gives
-- this one no room); a claim that paces a tenant also holds the tenants' default's lock,
-- shared. A change to a limit takes its lock (hold_limit), waiting for the claim pacing it.
-- Not the limit's row: the workers' grants lock it, and would wait for this claim's push to
-- Redis. Nothing written: a tenant's count a claim needs is made by advance_paces, at its
-- end, so no grant making the same count waits for the push.
WITH asked AS (
    SELECT * FROM unnest(CAST(:scopes AS text[]), CAST(:names AS text[])) AS a(scope, name)
), dflt AS MATERIALIZED (
    SELECT pg_try_advisory_xact_lock_shared(hashtext('duejobs-pace:tenant:*')) AS held
    WHERE EXISTS (SELECT 1 FROM asked WHERE scope = 'tenant')
), held AS MATERIALIZED (
    SELECT scope, name FROM asked
    WHERE CASE WHEN scope = 'tenant' AND NOT (SELECT held FROM dflt) THEN false
               ELSE pg_try_advisory_xact_lock(hashtext('duejobs-pace:' || scope || ':' || name))
          END
)
SELECT h.scope, h.name, l.paced_until, l.started_until,
       h.scope = 'tenant' AND l.max_starts IS NULL AS follows_default
FROM held h
LEFT JOIN /*schema*/rate_limits l ON l.scope = h.scope AND l.name = h.name

-- name: pace_rows
-- The slots a claim gave the rows it paced: each row due at its slot, with a `requeued` event
-- that keeps the due time it moved from (as a worker's turn-back does: its expiry still counts
-- from there).
WITH moved AS (
    UPDATE /*schema*/scheduled_jobs s SET due_at = m.slot, updated_at = statement_timestamp()
    FROM unnest(CAST(:ids AS uuid[]), CAST(:slots AS timestamptz[]),
                CAST(:moved_from AS timestamptz[])) AS m(id, slot, moved_from)
    WHERE s.id = m.id
    RETURNING s.id, s.tenant, s.version, s.attempts + 1 AS attempt, m.slot, m.moved_from
)
INSERT INTO /*schema*/scheduled_job_events (schedule_id, tenant, kind, version, detail)
SELECT id, tenant, 'requeued', version,
       jsonb_build_object('reason', 'rate_limited', 'due_at',
           (to_jsonb(CAST(slot AS timestamptz) AT TIME ZONE 'UTC') #>> '{}') || '+00:00',
           'moved_from',
           (to_jsonb(CAST(moved_from AS timestamptz) AT TIME ZONE 'UTC') #>> '{}')
               || '+00:00',
           'attempt', attempt, 'by', 'scheduler')
FROM moved

-- name: advance_paces
-- Each limit a claim paced, its pointer moved on to its next free slot: the claim's last
-- statement, after its push to Redis, so the row lock it takes (which the workers' grants
-- wait for) is held only to the commit that follows; waiting at most :lock_timeout for a row
-- another transaction holds (a grant holds it for a statement; an operator's, for longer).
-- A tenant's count (one that follows the default) that is not there — never made, or pruned
-- while the claim ran — is made with the pointer; a limit of its own is only updated (no
-- limit changes under a claim: hold_limit waits for it).
WITH paced AS (
    SELECT p.* FROM unnest(CAST(:scopes AS text[]), CAST(:names AS text[]),
                           CAST(:everies AS interval[]), CAST(:untils AS timestamptz[]),
                           CAST(:counts AS boolean[])) AS p(scope, name, every, until, count),
        (SELECT set_config('lock_timeout', :lock_timeout, true)) AS settings
), limits AS (
    UPDATE /*schema*/rate_limits l SET paced_until = p.until
    FROM paced p
    WHERE l.scope = p.scope AND l.name = p.name AND NOT p.count
)
INSERT INTO /*schema*/rate_limits AS c (scope, name, every, paced_until)
SELECT scope, name, every, until FROM paced WHERE count
ON CONFLICT (scope, name) DO UPDATE SET paced_until = EXCLUDED.paced_until
WHERE c.max_starts IS NULL
