-- The scheduler's claim: due rows shared fairly among tenants, under their in-flight caps.

-- name: claim_plan
-- For the claim's transaction (the walk, then the claim of the shares): no bitmap scan and no
-- sort where an index gives the order. Every read of the claim takes a tenant's rows in
-- (tenant, due_at) order, at most a batch of them, from the per-tenant index. On a partition
-- that holds most of the due rows (the current one, in partitioned mode) the planner otherwise
-- read a tenant's rows by bitmap, or its due_at index filtering out the other tenants', and
-- sorted them: the walk took 5x its time at a million rows (30 ms against 5.4 ms; the plain
-- schema's walk got faster too). tests/test_partition_plans.py pins the plan.
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
       set_config('enable_seqscan', 'off', true) AS seqscan,
       set_config('plan_cache_mode', 'force_generic_plan', true) AS plans

-- name: claim_walk
-- First half of a claim: walk the tenants that have rows waiting to be pushed, in name order
-- after a cursor, one index probe each (the recursion is evaluated only as far as the LIMIT
-- pulls it), and count each one's due rows up to the batch size. A tenant is "sparse" when
-- it has fewer than FRONT_LANE jobs waiting in the queue. Capped tenants are locked
-- (try-lock, held to the end of the claim's transaction) so that two claims never both fill
-- the same tenant's last places; their in-flight count here is an estimate for sharing the
-- batch, and the claim counts again under the lock.
WITH RECURSIVE tenants (tenant) AS (
    SELECT min(tenant) FROM /*schema*/scheduled_jobs
    WHERE status = 'scheduled' AND queue_job_id IS NULL AND tenant > :after
      AND EXISTS (SELECT 1 FROM /*schema*/scheduled_jobs WHERE status = 'scheduled'
          AND queue_job_id IS NULL
                  AND due_at <= statement_timestamp() + CAST(:window AS interval))
  UNION ALL
    SELECT (SELECT min(s.tenant) FROM /*schema*/scheduled_jobs s
            WHERE s.status = 'scheduled' AND s.queue_job_id IS NULL
              AND s.tenant > t.tenant)
    FROM tenants t WHERE t.tenant IS NOT NULL
), capped AS (
    SELECT t.tenant, COALESCE((SELECT max_inflight FROM /*schema*/tenant_quotas WHERE tenant =
        t.tenant), (SELECT max_inflight FROM /*schema*/tenant_quotas WHERE tenant = '*')) AS cap
    FROM tenants t WHERE t.tenant IS NOT NULL
), walked AS MATERIALIZED (  -- each tenant's count once (inlined, it ran twice: filter, output)
    SELECT p.tenant, p.cap,
           (SELECT count(*) FROM (
                SELECT 1 FROM /*schema*/scheduled_jobs s
                WHERE s.status = 'scheduled' AND s.queue_job_id IS NULL
                    AND (s.tenant, s.due_at) >= (p.tenant, CAST('-infinity' AS timestamptz))
                    AND (s.tenant, s.due_at) <= (p.tenant,
                    statement_timestamp() + CASE
                    WHEN p.cap IS NULL THEN CAST(:window AS interval) ELSE interval '0' END)
                -- in the per-tenant index's order: on a partition holding most due rows the
                -- planner would otherwise read its due_at index and filter out other tenants
                ORDER BY s.tenant, s.due_at
                LIMIT :limit) AS d) AS due
    FROM capped p
), picked AS (
    SELECT * FROM walked WHERE due > 0 LIMIT :limit
)
SELECT statement_timestamp() AS db_now, p.tenant, p.due, p.cap,
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
-- Second half: take each tenant's share of the batch — its due rows above priority 0 first,
-- then the oldest — FOR UPDATE SKIP LOCKED (a capped tenant's share cut to the room its cap
-- leaves, counted afresh), record the queue job ids and an `enqueued` event, and return the
-- rows in turns — every tenant's first row, then every tenant's second, each tenant's due rows
-- in priority then due order, then its later ones — so that the push interleaves tenants in
-- the queue as well.
WITH plan AS (
    SELECT p.tenant, p.cap,
           CASE WHEN p.cap IS NULL THEN p.share
                ELSE LEAST(p.share, p.cap - ((SELECT count(*) FROM (SELECT 1 FROM
                    /*schema*/scheduled_jobs WHERE tenant = p.tenant AND status = 'scheduled'
                    AND queue_job_id IS NOT NULL LIMIT p.cap) AS pushed) + (SELECT count(*) FROM
                    /*schema*/scheduled_jobs WHERE status = 'running'
                    AND tenant = p.tenant))) END AS n
    FROM unnest(CAST(:tenants AS text[]), CAST(:shares AS integer[]),
                CAST(:caps AS integer[])) AS p(tenant, share, cap)
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
                AND (s.tenant, s.due_at) >= (p.tenant, CAST('-infinity' AS timestamptz))
                AND (s.tenant, s.due_at) <= (p.tenant, statement_timestamp())
            ORDER BY s.tenant, s.due_at
            LIMIT GREATEST(p.n, 0)
            FOR UPDATE SKIP LOCKED
        ) AS urgent
        UNION ALL
        SELECT other.id FROM (
            SELECT s.id FROM /*schema*/scheduled_jobs s
            WHERE s.status = 'scheduled' AND s.queue_job_id IS NULL
                AND (s.priority <= 0 OR s.due_at > statement_timestamp())
                AND (s.tenant, s.due_at) >= (p.tenant, CAST('-infinity' AS timestamptz))
                AND (s.tenant, s.due_at) <= (p.tenant,
                statement_timestamp() + CASE
                WHEN p.cap IS NULL THEN CAST(:window AS interval) ELSE interval '0' END)
            ORDER BY s.tenant, s.due_at
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
