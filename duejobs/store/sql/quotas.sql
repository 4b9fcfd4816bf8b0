-- Tenant quotas: caps on live schedules and on jobs in flight (and, read with them, each
-- tenant's rate limit: duejobs.store.rate_limits).

-- name: set_quota
-- Set the caps flagged in :set_live / :set_inflight; the others keep their value (NULL: the
-- default's applies to a tenant, no cap for the default).
INSERT INTO /*schema*/tenant_quotas (tenant, max_live, max_inflight)
VALUES (:tenant, :max_live, :max_inflight)
ON CONFLICT (tenant) DO UPDATE
SET max_live = CASE WHEN :set_live THEN EXCLUDED.max_live ELSE /*schema*/tenant_quotas.max_live END,
    max_inflight = CASE WHEN :set_inflight THEN EXCLUDED.max_inflight
                        ELSE /*schema*/tenant_quotas.max_inflight END,
    updated_at = statement_timestamp()

-- name: quotas
-- The quotas and rate limits of every tenant with one of its own (:tenants NULL), or of
-- :tenants alone; the default's ('*') first, either way.
SELECT t.tenant, q.max_live, q.max_inflight, r.max_starts, r.period
FROM (SELECT tenant FROM /*schema*/tenant_quotas
      UNION SELECT name FROM /*schema*/rate_limits
      WHERE scope = 'tenant' AND max_starts IS NOT NULL) AS t
LEFT JOIN /*schema*/tenant_quotas q ON q.tenant = t.tenant
LEFT JOIN /*schema*/rate_limits r ON r.scope = 'tenant' AND r.name = t.tenant
    AND r.max_starts IS NOT NULL
WHERE CAST(:tenants AS text[]) IS NULL OR t.tenant = :default
    OR t.tenant = ANY(CAST(:tenants AS text[]))
ORDER BY t.tenant <> :default, t.tenant

-- name: live_quota
SELECT COALESCE((SELECT max_live FROM /*schema*/tenant_quotas WHERE tenant = :tenant),
    (SELECT max_live FROM /*schema*/tenant_quotas WHERE tenant = '*')) AS cap

-- name: lock_tenant_quota
-- Held to the end of the transaction: concurrent admissions cannot both take the last place.
SELECT pg_advisory_xact_lock(hashtext('duejobs-quota:' || :tenant))

-- name: count_live_up_to
SELECT (SELECT count(*) FROM (SELECT 1 FROM /*schema*/scheduled_jobs WHERE tenant = :tenant
                              AND status = 'scheduled'
                                  AND queue_job_id IS NULL LIMIT :cap) AS waiting)
       + ((SELECT count(*) FROM (SELECT 1 FROM /*schema*/scheduled_jobs WHERE tenant = :tenant
           AND status = 'scheduled'
           AND queue_job_id IS NOT NULL LIMIT :cap) AS pushed) + (SELECT count(*) FROM
           /*schema*/scheduled_jobs WHERE status = 'running' AND tenant = :tenant)) AS live

-- name: effective_caps
-- Each tenant's caps as they apply: its own, else the default's, else none.
SELECT t.tenant, COALESCE((SELECT max_live FROM /*schema*/tenant_quotas WHERE tenant = t.tenant),
    (SELECT max_live FROM /*schema*/tenant_quotas WHERE tenant = '*')) AS max_live,
       COALESCE((SELECT max_inflight FROM /*schema*/tenant_quotas WHERE tenant = t.tenant),
           (SELECT max_inflight FROM /*schema*/tenant_quotas WHERE tenant = '*')) AS max_inflight
FROM unnest(CAST(:tenants AS text[])) AS t(tenant)
