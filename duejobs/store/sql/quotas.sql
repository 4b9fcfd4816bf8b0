-- Tenant quotas: caps on live schedules and on jobs in flight.

-- name: set_quota
-- Set the caps flagged in :set_live / :set_inflight; the others keep their value (NULL: the
-- default's applies to a tenant, no cap for the default).
INSERT INTO tenant_quotas (tenant, max_live, max_inflight)
VALUES (:tenant, :max_live, :max_inflight)
ON CONFLICT (tenant) DO UPDATE
SET max_live = CASE WHEN :set_live THEN EXCLUDED.max_live ELSE tenant_quotas.max_live END,
    max_inflight = CASE WHEN :set_inflight THEN EXCLUDED.max_inflight
                        ELSE tenant_quotas.max_inflight END,
    updated_at = statement_timestamp()

-- name: quotas
SELECT tenant, max_live, max_inflight FROM tenant_quotas
ORDER BY tenant <> :default, tenant

-- name: live_quota
SELECT {{quota(max_live, :tenant)}} AS cap

-- name: lock_tenant_quota
-- Held to the end of the transaction: concurrent admissions cannot both take the last place.
SELECT pg_advisory_xact_lock(hashtext('duejobs-quota:' || :tenant))

-- name: count_live_up_to
SELECT (SELECT count(*) FROM (SELECT 1 FROM scheduled_jobs WHERE tenant = :tenant
                              AND {{unpushed}} LIMIT :cap) AS waiting)
       + {{inflight(:tenant, :cap)}} AS live

-- name: effective_caps
-- Each tenant's caps as they apply: its own, else the default's, else none.
SELECT t.tenant, {{quota(max_live, t.tenant)}} AS max_live,
       {{quota(max_inflight, t.tenant)}} AS max_inflight
FROM unnest(CAST(:tenants AS text[])) AS t(tenant)
