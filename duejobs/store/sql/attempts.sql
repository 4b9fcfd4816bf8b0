-- A worker's attempt: claim, lease, effect ledger, finish, stale and deferred records.

-- name: claim_runs
-- Deliveries turned into running attempts, many in one statement: those whose row is ready
-- now (scheduled at the delivered version, this its next attempt, due by the database clock,
-- not expired, of a type the worker has a handler for) and not locked by another transaction. The others are left untouched for
-- claim_verdict, which waits for a lock, says why a delivery cannot run and records it.
-- Each `started` event names the statement's :claim, by which a worker that lost the answer
-- finds the claims it made (claim_landed).
-- Rate limits (duejobs.store.rate_limits): a ready row under a queue's limit, or its tenant's
-- (its own, else the default's), starts only at a time its limit grants: now, or, for a row
-- due or granted within :hold of now, that moment (a start's slot just ahead: the worker waits
-- for it, as the attempt's started_at says). The others stay scheduled and go back to the
-- table without a queue job (a `requeued` event, reason rate_limited, with their slot) and are
-- returned with skip = 'rate_limited'. A row under no limit is claimed only once due. The
-- grant locks one row per limit the batch touches (in (scope, name) order), for this
-- statement only, waiting for it at most :lock_timeout (the worker's claim_lock_timeout); a
-- batch under no limit locks none.
-- Its commit's durability is its own (:synchronous_commit, the worker's bookkeeping setting;
-- NULL: the transaction's as it is), and so is its lock limit:
-- on the worker's hot path it runs alone, without bookkeeping_settings ahead of it (it waits
-- for no lock on a schedule: SKIP LOCKED).
WITH RECURSIVE req AS (
    SELECT r.* FROM unnest(CAST(:ids AS uuid[]), CAST(:tenants AS text[]),
                           CAST(:versions AS integer[]), CAST(:attempts AS integer[]))
        AS r(id, tenant, version, attempt),
        (SELECT set_config('synchronous_commit',
                           COALESCE(:synchronous_commit, current_setting('synchronous_commit')),
                           true) AS durability,
                set_config('lock_timeout',
                           COALESCE(:lock_timeout, current_setting('lock_timeout')),
                           true) AS lock_limit) AS settings
), ready AS (
    SELECT j.id, r.attempt, j.queue, j.tenant, j.due_at, j.version, j.interruptions, j.type,
           j.run_at, j.expires_after
    FROM req r
    JOIN /*schema*/scheduled_jobs j ON j.id = r.id AND j.tenant = r.tenant
    WHERE j.status = 'scheduled' AND j.version = r.version AND j.attempts = r.attempt - 1
      -- due, or within :hold for a start a rate limit may grant just ahead (below)
      AND j.due_at <= statement_timestamp() + CAST(:hold AS interval)
      -- Not expired, measured from the due time before any put-back of this attempt
      -- (defer_unknown_type and a rate limit's turn-back move due_at; their events keep the
      -- time it moved from): looked up for rows with an expiry only.
      AND (j.expires_after IS NULL OR j.due_at + j.expires_after >= statement_timestamp()
           AND NOT EXISTS (SELECT 1 FROM /*schema*/scheduled_job_events e
               WHERE e.schedule_id = j.id AND e.version = j.version AND e.kind = 'requeued'
                 AND e.detail ->> 'reason' IN ('unknown_type', 'rate_limited')
                 AND e.detail ->> 'attempt' = CAST(r.attempt AS text)
                 AND CAST(e.detail ->> 'moved_from' AS timestamptz) + j.expires_after
                     < statement_timestamp()))
      AND j.type = ANY(CAST(:types AS text[]))
    ORDER BY j.id
    FOR UPDATE OF j SKIP LOCKED
), once AS (  -- two copies of one delivery in a batch count once
    SELECT DISTINCT id, attempt, queue, tenant, due_at, version, interruptions, type, run_at,
                    expires_after
    FROM ready
), limited AS (
    -- Each ready row under each limit in force on it.
    SELECT r.id, 'queue' AS scope, r.queue AS name, q.every, q.period
    FROM once r
    JOIN /*schema*/rate_limits q ON q.scope = 'queue' AND q.name = r.queue
    WHERE q.max_starts IS NOT NULL
    UNION ALL
    SELECT r.id, 'tenant', r.tenant,
           CASE WHEN own.max_starts IS NOT NULL THEN own.every ELSE dflt.every END,
           CASE WHEN own.max_starts IS NOT NULL THEN own.period ELSE dflt.period END
    FROM once r
    LEFT JOIN /*schema*/rate_limits own ON own.scope = 'tenant' AND own.name = r.tenant
    LEFT JOIN /*schema*/rate_limits dflt ON dflt.scope = 'tenant' AND dflt.name = '*'
    WHERE COALESCE(own.max_starts, dflt.max_starts) IS NOT NULL
), state AS (
    -- The counts of the limits asked, locked in (scope, name) order for this statement: as
    -- they are once locked (a change committed while this waited for one is read here).
    SELECT l.scope, l.name, l.started_until, l.window_start, l.max_starts, l.every, l.period
    FROM /*schema*/rate_limits l
    WHERE (l.scope, l.name) IN (SELECT scope, name FROM limited)
    ORDER BY l.scope, l.name
    FOR UPDATE
), lim AS (
    -- Each limit asked, keyed 'scope:name': its interval (a limit's own as locked, not as
    -- this statement first read it), whether its count is made (a tenant's first start under
    -- the default: not yet; it grants none, its count is made below and its rows come back at
    -- once), and its TAT — when its next start is due at its pace (GCRA's theoretical arrival
    -- time), never before now.
    SELECT k.scope, k.name, k.scope || ':' || k.name AS key,
           CASE WHEN s.max_starts IS NOT NULL THEN s.every ELSE k.every END AS every,
           CASE WHEN s.max_starts IS NOT NULL THEN s.period ELSE k.period END AS period,
           s.scope IS NOT NULL AS counted, s.window_start,
           GREATEST(s.started_until, statement_timestamp()) AS tat
    FROM (SELECT scope, name, max(every) AS every, max(period) AS period
          FROM limited GROUP BY scope, name) AS k
    LEFT JOIN state s ON s.scope = k.scope AND s.name = k.name
), paced AS (
    -- The rows under a limit in due order, each with its limits' keys and, for a row with an
    -- expiry, the last moment it may start (from its due time before any put-back).
    SELECT o.id, o.due_at, row_number() OVER (ORDER BY o.due_at, o.id) AS k,
           array_agg(m.scope || ':' || m.name) AS keys,
           CASE WHEN o.expires_after IS NOT NULL THEN LEAST(o.due_at, (
               SELECT min(CAST(e.detail ->> 'moved_from' AS timestamptz))
               FROM /*schema*/scheduled_job_events e
               WHERE e.schedule_id = o.id AND e.version = o.version AND e.kind = 'requeued'
                 AND e.detail ->> 'reason' IN ('unknown_type', 'rate_limited')
                 AND e.detail ->> 'attempt' = CAST(o.attempt AS text))) + o.expires_after
           END AS expires_at
    FROM once o JOIN limited m ON m.id = o.id
    GROUP BY o.id, o.due_at, o.expires_after, o.version, o.attempt
), walk (k, tats, id, at, granted) AS (
    -- GCRA with one start's tolerance over every limit at once, row after row in due order:
    -- a row's start is the latest of now, its due time and, for each of its limits, the
    -- limit's TAT less one interval (the tolerance). It is granted when that is within :hold
    -- (the worker's slot waits for it) and before its expiry, every limit counted; then each
    -- of its limits' TAT moves to one interval past the later of the TAT and the start. A row
    -- turned back moves none: its place goes to the rows after it. In any window of one
    -- period, at most N starts of a limit, plus one.
    SELECT CAST(0 AS bigint), (SELECT jsonb_object_agg(key, tat) FROM lim),
           CAST(NULL AS uuid), CAST(NULL AS timestamptz), CAST(NULL AS boolean)
    UNION ALL
    SELECT p.k, CASE WHEN g.granted THEN w.tats || g.tats ELSE w.tats END, p.id, g.at,
           g.granted
    FROM walk w
    JOIN paced p ON p.k = w.k + 1
    CROSS JOIN LATERAL (
        SELECT t.at,
               bool_and(l.counted) AND t.at <= statement_timestamp() + CAST(:hold AS interval)
                   AND (p.expires_at IS NULL OR t.at <= p.expires_at) AS granted,
               jsonb_object_agg(l.key, GREATEST(CAST(w.tats ->> l.key AS timestamptz), t.at)
                                       + l.every) AS tats
        FROM lim l
        CROSS JOIN LATERAL (
            SELECT GREATEST(statement_timestamp(), p.due_at,
                            max(CAST(w.tats ->> o.key AS timestamptz) - o.every)) AS at
            FROM lim o WHERE o.key = ANY(p.keys)) AS t
        WHERE l.key = ANY(p.keys)
        GROUP BY t.at
    ) AS g
), granted AS (
    SELECT id, at, NOT granted AS refused FROM walk WHERE k > 0
), taken AS (
    -- Each limit's starts, and its TAT after the walk.
    SELECT l.scope, l.name, l.counted, l.every, l.period, count(*)::integer AS asked,
           (count(*) FILTER (WHERE NOT g.refused))::integer AS started,
           (SELECT CAST(w.tats ->> l.key AS timestamptz) FROM walk w
            ORDER BY w.k DESC LIMIT 1) AS started_until,
           -- the fixed window of one period the starts are counted in (rate_limits reads
           -- them): the same one, the next (the current one kept as the one before), or a new
           CASE WHEN l.window_start IS NULL
                     OR statement_timestamp() >= l.window_start + 2 * l.period THEN 'new'
                WHEN statement_timestamp() >= l.window_start + l.period THEN 'next'
                ELSE 'same' END AS window_is
    FROM lim l
    JOIN limited m ON m.scope = l.scope AND m.name = l.name
    JOIN granted g ON g.id = m.id
    GROUP BY l.scope, l.name, l.key, l.counted, l.every, l.period, l.window_start
), counted AS (
    -- Only starts move a count on: starts turned back again and again never push it ahead.
    UPDATE /*schema*/rate_limits l
    SET started_until = t.started_until, every = t.every, asked = t.asked, granted = t.started,
        updated_at = statement_timestamp(),
        window_start = CASE t.window_is WHEN 'same' THEN l.window_start
                            WHEN 'next' THEN l.window_start + t.period
                            ELSE statement_timestamp() END,
        previous_starts = CASE t.window_is WHEN 'same' THEN l.previous_starts
                               WHEN 'next' THEN l.window_starts ELSE 0 END,
        window_starts = CASE t.window_is WHEN 'same' THEN l.window_starts + t.started
                             ELSE t.started END
    FROM taken t
    WHERE l.scope = t.scope AND l.name = t.name AND t.counted
), made AS (
    INSERT INTO /*schema*/rate_limits (scope, name, every, asked)
    SELECT scope, name, every, asked FROM taken WHERE NOT counted
    ON CONFLICT (scope, name) DO NOTHING
), moved AS (
    -- Refused: back to the table, no queue job (the worker finishes the one it took), its
    -- due time as it was, for the scheduler to push again when its limit's pace has a start
    -- for it (duejobs.scheduler.pacing), as it pushes every row under a limit. Not back to
    -- RQ's scheduled registry at its slot: a slot there is not reserved, so under a limit at
    -- its pace the jobs put back and those the scheduler paced meet at the same times, and
    -- each is turned back again and again.
    UPDATE /*schema*/scheduled_jobs s SET queue_job_id = NULL, updated_at = statement_timestamp()
    FROM granted g JOIN once r ON r.id = g.id
    WHERE s.id = g.id AND g.refused
    RETURNING s.id, s.tenant, s.version, r.attempt, s.interruptions, s.type, s.run_at,
              g.at AS slot, r.due_at AS moved_from
), upd AS (
    -- Started: due now under no limit, or at the start its limits granted.
    UPDATE /*schema*/scheduled_jobs s
    SET status = 'running', attempts = o.attempt,
        started_at = COALESCE(g.at, statement_timestamp()),
        lease_expires_at = statement_timestamp() + CAST(:lease AS interval),
        updated_at = statement_timestamp()
    FROM once o LEFT JOIN granted g ON g.id = o.id
    WHERE s.id = o.id
      AND (g.id IS NULL AND o.due_at <= statement_timestamp() OR NOT g.refused)
    RETURNING s.id, s.tenant, s.version, s.attempts, s.interruptions, s.type, s.payload,
              s.run_at, s.due_at, s.trace_context, s.started_at
), attempt AS (
    INSERT INTO /*schema*/scheduled_job_attempts (schedule_id, tenant, version, attempt, status,
        worker, started_at)
    SELECT id, tenant, version, attempts, 'running', :worker, started_at FROM upd
), event AS (
    INSERT INTO /*schema*/scheduled_job_events (schedule_id, tenant, kind, version, detail)
    SELECT id, tenant, 'started', version,
           jsonb_build_object(
               'attempt', attempts, 'worker', :worker, 'type', type, 'claim', CAST(:claim AS text),
               'lag_ms', round(extract(epoch FROM started_at - due_at) * 1000))
    FROM upd
    UNION ALL
    SELECT id, tenant, 'requeued', version,
           jsonb_build_object('reason', 'rate_limited', 'due_at',
               (to_jsonb(CAST(slot AS timestamptz) AT TIME ZONE 'UTC') #>> '{}') || '+00:00',
               'moved_from',
               (to_jsonb(CAST(moved_from AS timestamptz) AT TIME ZONE 'UTC') #>> '{}')
                   || '+00:00',
               'attempt', attempt, 'worker', CAST(:worker AS text))
    FROM moved
)
SELECT id, version, attempts AS attempt, interruptions, type, payload, run_at, due_at,
       statement_timestamp() AS db_now, started_at, trace_context, NULL AS skip
FROM upd
UNION ALL
SELECT id, version, attempt, interruptions, type, NULL, run_at, slot, statement_timestamp(),
       NULL, NULL, 'rate_limited'
FROM moved

-- name: claim_landed
-- A delivery's claim made by the statement named :claim, whose answer the worker lost (its
-- connection broke after the commit): the row still running at that attempt, as claim_runs
-- would have returned it; nothing when that statement did not commit it.
SELECT j.id, j.version, j.attempts AS attempt, j.interruptions, j.type, j.payload, j.run_at,
       j.due_at, statement_timestamp() AS db_now, j.started_at, j.trace_context
FROM /*schema*/scheduled_jobs j
WHERE j.id = :id AND j.tenant = :tenant AND j.version = :version AND j.attempts = :attempt
  AND j.status = 'running'
  AND EXISTS (SELECT 1 FROM /*schema*/scheduled_job_events e
              WHERE e.schedule_id = j.id AND e.kind = 'started' AND e.version = :version
                AND e.detail ->> 'claim' = :claim)

-- name: claim_verdict
-- Why a delivery claim_runs left unclaimed cannot run now, waiting for a row lock held
-- elsewhere (up to the connection's lock_timeout): the skip verdict (the attempt must be the
-- next one of a scheduled row), then the database clock (not due yet, or past its expiry),
-- then its type (one the worker has no handler for: since when this attempt has been put
-- back for that, its grace its own — a retry is not failed for its first attempt's put-backs).
-- Skips other than not_due are recorded as events. NULL: it can run (its row was locked).
WITH cur AS (
    SELECT id, tenant, type, version, status, attempts, run_at, due_at, payload,
           expires_after
    FROM /*schema*/scheduled_jobs
    WHERE id = :id AND tenant = :tenant
    FOR UPDATE
), verdict AS (
    SELECT cur.*,
           COALESCE(CASE WHEN status = 'cancelled' THEN 'cancelled'
               WHEN version <> :version THEN 'superseded' WHEN status <> :current_status
               OR attempts <> :current_attempts THEN 'duplicate' END,
                    CASE WHEN due_at > statement_timestamp() THEN 'not_due'
                         WHEN due_at + expires_after < statement_timestamp()
                           OR EXISTS (SELECT 1 FROM /*schema*/scheduled_job_events e
                               WHERE e.schedule_id = cur.id AND e.version = cur.version
                                 AND e.kind = 'requeued'
                                 AND e.detail ->> 'reason' IN ('unknown_type',
                                                               'rate_limited')
                                 AND e.detail ->> 'attempt' = CAST(:attempt AS text)
                                 AND CAST(e.detail ->> 'moved_from' AS timestamptz)
                                     + expires_after < statement_timestamp()) THEN 'expired'
                         WHEN NOT (type = ANY(CAST(:types AS text[]))) THEN 'unknown_type'
                    END) AS reason
    FROM cur
), event AS (
    INSERT INTO /*schema*/scheduled_job_events (schedule_id, tenant, kind, version, detail)
    SELECT id, tenant, 'skipped', version,
           jsonb_build_object('reason', reason, 'delivered_version', CAST(:version AS integer),
                              'attempt', CAST(:attempt AS integer),
                              'worker', CAST(:worker AS text))
    FROM verdict
    WHERE reason IN ('cancelled', 'superseded', 'duplicate', 'expired')
)
SELECT reason, type, due_at, statement_timestamp() AS db_now,
       CASE WHEN reason = 'unknown_type' THEN (
           SELECT min(e.at) FROM /*schema*/scheduled_job_events e
           WHERE e.schedule_id = verdict.id AND e.version = verdict.version
             AND e.kind = 'requeued' AND e.detail ->> 'reason' = 'unknown_type'
             AND e.detail ->> 'attempt' = CAST(:attempt AS text))
       END AS unknown_since
FROM verdict

-- name: record_deferred
-- A delivery put back without using an attempt — early (not_due), or of a type the worker
-- has no handler for (unknown_type) —: the history says so.
INSERT INTO /*schema*/scheduled_job_events (schedule_id, tenant, kind, version, detail)
SELECT id, tenant, 'requeued', version,
       jsonb_build_object('reason', CAST(:reason AS text), 'due_at',
           (to_jsonb(CAST(due_at AS timestamptz) AT TIME ZONE 'UTC') #>> '{}') || '+00:00',
                          'attempt', CAST(:attempt AS integer), 'worker', CAST(:worker AS text))
FROM /*schema*/scheduled_jobs
WHERE id = :id AND version = :version AND status = 'scheduled'

-- name: defer_unknown_type
-- A delivery of a type the worker has no handler for, put back: the row due again at the
-- time its job goes back for (so the reconciler finds the job where it belongs), no attempt
-- used, the history saying so (its first such event starts the grace period) and keeping
-- the due time it moved from, from which its expiry stays measured (claim_runs).
WITH cur AS (
    SELECT id, due_at FROM /*schema*/scheduled_jobs WHERE id = :id
), upd AS (
    UPDATE /*schema*/scheduled_jobs s SET due_at = :due_at, updated_at = statement_timestamp()
    FROM cur
    WHERE s.id = cur.id AND s.version = :version AND s.status = 'scheduled'
      AND s.attempts = :attempt - 1
    RETURNING s.id, s.tenant, s.version, s.due_at, cur.due_at AS moved_from
)
INSERT INTO /*schema*/scheduled_job_events (schedule_id, tenant, kind, version, detail)
SELECT id, tenant, 'requeued', version,
       jsonb_build_object('reason', 'unknown_type', 'due_at',
           (to_jsonb(CAST(due_at AS timestamptz) AT TIME ZONE 'UTC') #>> '{}') || '+00:00',
           'moved_from',
           (to_jsonb(CAST(moved_from AS timestamptz) AT TIME ZONE 'UTC') #>> '{}') || '+00:00',
           'attempt', :attempt, 'worker', CAST(:worker AS text))
FROM upd

-- name: fail_unknown_type
-- A schedule whose type no worker that took it had a handler for, for longer than the grace
-- period: failed for good, without an attempt, the error naming the type.
WITH upd AS (
    UPDATE /*schema*/scheduled_jobs
    SET status = 'failed', last_error = :error, finished_at = statement_timestamp(),
        updated_at = statement_timestamp(), lease_expires_at = NULL
    WHERE id = :id AND version = :version AND status = 'scheduled' AND attempts = :attempt - 1
    RETURNING id, tenant, version
), event AS (
    INSERT INTO /*schema*/scheduled_job_events (schedule_id, tenant, kind, version, detail)
    SELECT id, tenant, 'failed', version,
           jsonb_build_object('reason', 'unknown_type', 'error', CAST(:error AS text),
                              'worker', CAST(:worker AS text))
    FROM upd
)
SELECT id FROM upd

-- name: expire
UPDATE /*schema*/scheduled_jobs SET status = 'cancelled', version = version + 1,
       finished_at = statement_timestamp(), updated_at = statement_timestamp(),
       last_error = 'expired: due ' || due_at || ', allowed ' || expires_after || ' late'
WHERE id = :id AND version = :version AND status = 'scheduled'

-- name: change_since_claim
-- The skip verdict of a running attempt (NULL while it is the current one).
SELECT CASE WHEN status = 'cancelled' THEN 'cancelled'
    WHEN version <> :version THEN 'superseded' WHEN status <> :current_status
    OR attempts <> :current_attempts THEN 'duplicate' END AS reason FROM /*schema*/scheduled_jobs
    WHERE id = :id

-- name: change_since_claim_locked
-- The same, keeping the row locked to the end of the transaction (the effect fence), whose
-- session the server ends should it sit idle past :idle_timeout (for this transaction alone;
-- a shorter limit already in force, the role's or the application's, is kept): a client gone
-- without a reset leaves the row locked no longer than that.
SELECT CASE WHEN status = 'cancelled' THEN 'cancelled'
    WHEN version <> :version THEN 'superseded' WHEN status <> :current_status
    OR attempts <> :current_attempts THEN 'duplicate' END AS reason,
    set_config('idle_in_transaction_session_timeout',
        CASE WHEN CAST(current_setting('idle_in_transaction_session_timeout') AS interval)
                  BETWEEN interval '1 millisecond' AND CAST(CAST(:idle_timeout AS text) AS interval)
             THEN current_setting('idle_in_transaction_session_timeout')
             ELSE CAST(:idle_timeout AS text) END, true) AS idle_timeout
    FROM /*schema*/scheduled_jobs WHERE id = :id FOR UPDATE

-- name: extend_leases
-- Push forward the leases of the running attempts given, in one statement. A row locked by
-- its own handler's ctx.transaction() (or by an application) is skipped this beat, never
-- waited for: the reconciler's rescue skips locked rows too.
UPDATE /*schema*/scheduled_jobs s
SET lease_expires_at = statement_timestamp() + CAST(:lease AS interval)
FROM (
    SELECT j.id
    FROM unnest(CAST(:ids AS uuid[]), CAST(:versions AS integer[]),
                CAST(:attempts AS integer[])) AS r(id, version, attempt)
    JOIN /*schema*/scheduled_jobs j ON j.id = r.id AND j.version = r.version
        AND j.attempts = r.attempt
    WHERE j.status = 'running'
    ORDER BY j.id
    FOR UPDATE OF j SKIP LOCKED
) AS mine
WHERE s.id = mine.id

-- name: renew_claim
-- A claim made ahead of its handler, renewed just before the handler starts: only while it
-- is still the current attempt. A lease that ran out and was not rescued yet is renewed too:
-- the row lock orders this with the reconciler's rescue (which skips locked rows and takes
-- only rows still expired), so exactly one of them wins. Nothing when it cannot be renewed.
UPDATE /*schema*/scheduled_jobs
SET lease_expires_at = statement_timestamp() + CAST(:lease AS interval)
WHERE id = :id AND version = :version AND attempts = :attempt AND status = 'running'
RETURNING id

-- name: record_effect
INSERT INTO /*schema*/scheduled_job_effects (effect_key, schedule_id, tenant, version)
VALUES (:key, :id, :tenant, :version) ON CONFLICT (effect_key) DO NOTHING
RETURNING 1

-- name: finish
-- Close running attempts, many in one statement: succeeded, failed, or back to scheduled for
-- a retry (run_at never moves; due_at carries the next attempt's time), each with its
-- attempt row and event. An interrupted attempt (its connection broke) is a retry counted in
-- the row's interruptions, its `retried` event marked `interrupted`. An attempt no longer current is left alone, and so is one whose row
-- another transaction holds now: the worker waits for that lock, then closes it or records
-- it stale. Its commit's durability is its own, as claim_runs' is.
WITH req AS (
    SELECT r.* FROM unnest(CAST(:ids AS uuid[]), CAST(:versions AS integer[]),
                           CAST(:attempts AS integer[]), CAST(:statuses AS text[]),
                           CAST(:events AS text[]), CAST(:errors AS text[]),
                           CAST(:retry_ins AS interval[]), CAST(:interrupted AS boolean[]))
        AS r(id, version, attempt, status, event, error, retry_in, interrupted),
        (SELECT set_config('synchronous_commit',
                           COALESCE(:synchronous_commit, current_setting('synchronous_commit')),
                           true)) AS durability
), mine AS (
    SELECT r.*
    FROM req r
    JOIN /*schema*/scheduled_jobs j ON j.id = r.id AND j.version = r.version
        AND j.attempts = r.attempt
    WHERE j.status = 'running'
    ORDER BY j.id
    FOR UPDATE OF j SKIP LOCKED
), upd AS (
    UPDATE /*schema*/scheduled_jobs s
    SET status = m.status,
        due_at = CASE WHEN m.retry_in IS NULL THEN s.due_at
                      ELSE statement_timestamp() + m.retry_in END,
        queue_job_id = CASE WHEN m.status = 'scheduled' THEN NULL ELSE s.queue_job_id END,
        finished_at = CASE WHEN m.status = 'scheduled' THEN NULL
                           ELSE statement_timestamp() END,
        last_error = m.error,
        interruptions = s.interruptions + CASE WHEN m.interrupted THEN 1 ELSE 0 END,
        lease_expires_at = NULL,
        updated_at = statement_timestamp()
    FROM mine m
    WHERE s.id = m.id
    RETURNING s.id, s.tenant, s.version, s.due_at, m.attempt, m.status, m.event, m.error,
              m.interrupted
), attempt AS (
    UPDATE /*schema*/scheduled_job_attempts a
    SET status = CASE WHEN upd.status = 'succeeded' THEN 'succeeded' ELSE 'failed' END,
        finished_at = statement_timestamp(), error = upd.error,
        next_attempt_at = CASE WHEN upd.status = 'scheduled' THEN upd.due_at END
    FROM upd
    WHERE a.schedule_id = upd.id AND a.version = upd.version AND a.attempt = upd.attempt
), event AS (
    INSERT INTO /*schema*/scheduled_job_events (schedule_id, tenant, kind, version, detail)
    SELECT id, tenant, event, version,
           jsonb_strip_nulls(jsonb_build_object(
               'attempt', attempt, 'error', error,
               'interrupted', CASE WHEN interrupted THEN true END,
               'next_attempt_at', (to_jsonb(CAST(CASE
                   WHEN status = 'scheduled' THEN due_at END AS timestamptz) AT TIME ZONE 'UTC')
                   #>> '{}') || '+00:00'))
    FROM upd
)
SELECT id, version, attempt FROM upd

-- name: attempt_closed
-- How a running attempt was closed, if it was: what a worker whose answer to `finish` was lost
-- (its connection broke) reads to tell a commit that landed from one that did not.
SELECT CASE WHEN status = 'succeeded' THEN 'succeeded'
            WHEN next_attempt_at IS NOT NULL THEN 'scheduled' ELSE 'failed' END AS closed_as
FROM /*schema*/scheduled_job_attempts
WHERE schedule_id = :id AND version = :version AND attempt = :attempt
  AND status IN ('succeeded', 'failed')

-- name: record_stale
-- A running attempt whose schedule moved on: its result is not applied, the history says so.
WITH att AS (
    UPDATE /*schema*/scheduled_job_attempts
    SET status = 'stale', finished_at = statement_timestamp(), error = :reason
    WHERE schedule_id = :id AND version = :version AND attempt = :attempt
      AND status = 'running'
    RETURNING schedule_id, tenant
)
INSERT INTO /*schema*/scheduled_job_events (schedule_id, tenant, kind, version, detail)
SELECT schedule_id, tenant, 'skipped', :version,
       jsonb_build_object('reason', :reason, 'attempt', :attempt, 'while', 'running')
FROM att

-- name: bookkeeping_settings
-- Ahead of each statement of a worker's bookkeeping, in its transaction: it gives up on a row
-- lock an application holds after :lock_timeout, its commit waits for the WAL flush only
-- with durable bookkeeping, and nothing is compiled (JIT: a statement over a partitioned table
-- can pass jit_above_cost, and each is short). For that transaction alone: a pooled server
-- session's next client sees none of it.
SELECT set_config('lock_timeout', :lock_timeout, true) AS lock_timeout,
       set_config('synchronous_commit', :synchronous_commit, true) AS synchronous_commit,
       set_config('jit', 'off', true) AS jit

-- name: bookkeeping_durability
-- How a bookkeeping statement commits (its own settings ahead of it), and the standbys the
-- server waits for on a durable commit: read at a worker's start, to say what a failover can
-- lose.
SELECT current_setting('synchronous_commit') AS synchronous_commit,
       current_setting('synchronous_standby_names') AS standbys

-- name: bounded_locks
-- This transaction gives up on a row lock after a second (the heartbeat's and the
-- watchdog's statements must not hang behind a handler's own effect transaction).
SELECT set_config('lock_timeout', '1s', true)
