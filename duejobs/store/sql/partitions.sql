-- Partitioned mode (see duejobs/store/partitions.py): its settings, the catalog reads that
-- turn the plain tables into partitioned ones, and what maintenance asks of the catalog.
-- Table names appear here only where the schema's prefix must apply; the catalog is asked
-- by parameters.

-- name: partitioning_table
SELECT to_regclass(format('%I.%I', CAST(:schema AS text), CAST(:name AS text))) IS NOT NULL
       AS present

-- name: partitioning
SELECT period, ahead FROM /*schema*/duejobs_partitioning

-- name: create_partitioning
CREATE TABLE /*schema*/duejobs_partitioning (
    period  interval NOT NULL CHECK (period >= interval '1 hour'),
    ahead   integer NOT NULL CHECK (ahead BETWEEN 1 AND 1000)
)

-- name: set_partitioning
INSERT INTO /*schema*/duejobs_partitioning (period, ahead) VALUES (:period, :ahead)

-- name: create_keys
-- The keys of live schedules, one row each (kept by triggers on scheduled_jobs).
CREATE TABLE /*schema*/scheduled_job_keys (
    tenant       text NOT NULL,
    key          text NOT NULL,
    schedule_id  uuid NOT NULL,
    PRIMARY KEY (tenant, key)
)

-- name: any_row_scheduled_jobs
SELECT EXISTS (SELECT 1 FROM /*schema*/scheduled_jobs) AS present

-- name: any_row_scheduled_job_events
SELECT EXISTS (SELECT 1 FROM /*schema*/scheduled_job_events) AS present

-- name: any_row_scheduled_job_attempts
SELECT EXISTS (SELECT 1 FROM /*schema*/scheduled_job_attempts) AS present

-- name: any_row_scheduled_job_results
SELECT EXISTS (SELECT 1 FROM /*schema*/scheduled_job_results) AS present

-- name: foreign_keys_to
-- Foreign keys that reference the table :name of :schema, and the tables that hold them.
SELECT c.conname AS name, owner.relname AS owner
FROM pg_constraint c
JOIN pg_class target ON target.oid = c.confrelid
JOIN pg_namespace n ON n.oid = target.relnamespace
JOIN pg_class owner ON owner.oid = c.conrelid
WHERE c.contype = 'f' AND n.nspname = :schema AND target.relname = :name

-- name: table_shape
-- What a table is made of besides its columns and checks, as PostgreSQL prints it: its
-- primary and foreign keys, its other indexes, its identity's sequence.
WITH t AS (
    SELECT c.oid FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
    WHERE n.nspname = :schema AND c.relname = :name
)
SELECT 'constraint' AS kind, c.conname AS name, pg_get_constraintdef(c.oid) AS definition
FROM pg_constraint c, t WHERE c.conrelid = t.oid AND c.contype IN ('p', 'f')
UNION ALL
SELECT 'index', i.relname, pg_get_indexdef(i.oid)
FROM pg_index x JOIN pg_class i ON i.oid = x.indexrelid, t
WHERE x.indrelid = t.oid
  AND NOT EXISTS (SELECT 1 FROM pg_constraint c WHERE c.conindid = i.oid AND c.conrelid = t.oid)
UNION ALL
SELECT 'sequence', s.relname, NULL
FROM pg_depend d JOIN pg_class s ON s.oid = d.objid, t
WHERE d.refobjid = t.oid AND d.deptype = 'i' AND s.relkind = 'S'

-- name: list_partitions
-- The partitions of the table :name of :schema: bounds as PostgreSQL prints them, and the
-- rows the planner estimates (-1 before the first ANALYZE).
SELECT c.relname AS name, pg_get_expr(c.relpartbound, c.oid) AS bound, c.reltuples AS rows
FROM pg_inherits i
JOIN pg_class c ON c.oid = i.inhrelid
JOIN pg_class p ON p.oid = i.inhparent
JOIN pg_namespace n ON n.oid = p.relnamespace
WHERE n.nspname = :schema AND p.relname = :name

-- name: set_lock_timeout
SELECT set_config('lock_timeout', :timeout, true)

-- name: delete_orphan_effects
-- Effect-ledger rows of schedules with ids in [:low, :high) that are gone (their range
-- dropped; the ledger is not partitioned: its key is unique across every schedule), a batch
-- at a time.
DELETE FROM /*schema*/scheduled_job_effects WHERE ctid = ANY(ARRAY(
    SELECT e.ctid FROM /*schema*/scheduled_job_effects e
    WHERE e.schedule_id >= :low AND e.schedule_id < :high
      AND NOT EXISTS (SELECT 1 FROM /*schema*/scheduled_jobs j WHERE j.id = e.schedule_id)
    LIMIT :limit
))

-- name: partition_indexes
-- A partition's indexes and the index of its parent each one belongs to.
SELECT child.relname AS name, parent.relname AS parent
FROM pg_index x
JOIN pg_class child ON child.oid = x.indexrelid
JOIN pg_inherits i ON i.inhrelid = child.oid
JOIN pg_class parent ON parent.oid = i.inhparent
JOIN pg_class t ON t.oid = x.indrelid
JOIN pg_namespace n ON n.oid = t.relnamespace
WHERE n.nspname = :schema AND t.relname = :name

-- name: oldest_stamped_id
-- The lowest id stamped with a time (version 7 or 8), read along the primary key.
SELECT id FROM /*schema*/scheduled_jobs WHERE substr(CAST(id AS text), 15, 1) IN ('7', '8')
ORDER BY id LIMIT 1

-- name: table_columns
-- A table's columns in order (dropped ones left out).
SELECT a.attname AS name
FROM pg_attribute a
JOIN pg_class c ON c.oid = a.attrelid
JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE n.nspname = :schema AND c.relname = :name AND a.attnum > 0 AND NOT a.attisdropped
ORDER BY a.attnum

-- name: primary_key_columns
-- A table's primary key columns in the key's order.
SELECT a.attname AS name
FROM pg_constraint k
JOIN pg_class c ON c.oid = k.conrelid
JOIN pg_namespace n ON n.oid = c.relnamespace
JOIN LATERAL unnest(k.conkey) WITH ORDINALITY AS u(attnum, ord) ON true
JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum = u.attnum
WHERE n.nspname = :schema AND c.relname = :name AND k.contype = 'p'
ORDER BY u.ord

-- name: partition_tables
-- Every partition of the tables :names of :schema.
SELECT c.relname AS name
FROM pg_inherits i
JOIN pg_class c ON c.oid = i.inhrelid
JOIN pg_class p ON p.oid = i.inhparent
JOIN pg_namespace n ON n.oid = p.relnamespace
WHERE n.nspname = :schema AND p.relname = ANY(CAST(:names AS text[])) AND c.relkind = 'r'

-- name: carry_identity
-- The staging events' identity goes on from where the source's is.
SELECT setval(pg_get_serial_sequence(format('%I.%I', CAST(:staging AS text),
                                            CAST(:name AS text)), 'id'),
              nextval(pg_get_serial_sequence(format('%I.%I', CAST(:source AS text),
                                                    CAST(:name AS text)), 'id')))

-- name: table_rights
-- Who owns each table :names of :schema (mine: the role running this), and the privileges
-- granted on it, or on one of its columns, to roles other than its owner (grantee NULL:
-- PUBLIC; column_name NULL: the whole table).
WITH t AS (
    SELECT c.oid, c.relname, c.relowner, c.relacl
    FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
    WHERE n.nspname = :schema AND c.relname = ANY(CAST(:names AS text[]))
), granted AS (
    SELECT t.oid, CAST(NULL AS text) AS column_name, a.grantee, a.privilege_type,
           a.is_grantable
    FROM t, aclexplode(t.relacl) a
    UNION ALL
    SELECT t.oid, CAST(att.attname AS text), a.grantee, a.privilege_type, a.is_grantable
    FROM t JOIN pg_attribute att ON att.attrelid = t.oid AND att.attnum > 0
                                AND NOT att.attisdropped,
         aclexplode(att.attacl) a
)
SELECT t.relname AS name, pg_get_userbyid(t.relowner) AS owner,
       pg_get_userbyid(t.relowner) = current_user AS mine, g.column_name,
       CASE WHEN g.grantee <> 0 THEN pg_get_userbyid(g.grantee) END AS grantee,
       g.privilege_type AS privilege, g.is_grantable AS grantable
FROM t LEFT JOIN granted g ON g.oid = t.oid AND g.grantee <> t.relowner

-- name: try_session_lock
SELECT pg_try_advisory_lock(:key) AS locked

-- name: session_unlock
SELECT pg_advisory_unlock(:key)

-- name: default_holds
-- Whether a default partition holds a row of the id range [:low, :high), which no other
-- partition covers (so only the default ones are read).
SELECT EXISTS (SELECT 1 FROM /*schema*/scheduled_jobs WHERE id >= :low AND id < :high)
    OR EXISTS (SELECT 1 FROM /*schema*/scheduled_job_events
               WHERE schedule_id >= :low AND schedule_id < :high)
    OR EXISTS (SELECT 1 FROM /*schema*/scheduled_job_attempts
               WHERE schedule_id >= :low AND schedule_id < :high)
    OR EXISTS (SELECT 1 FROM /*schema*/scheduled_job_results
               WHERE schedule_id >= :low AND schedule_id < :high) AS present

-- name: autovacuumed_tables
-- Which of :names in :schema an autovacuum worker holds a lock on (a table's TOAST table held
-- counts as the table), unless it runs to prevent wraparound (that one yields to no one).
SELECT c.relname AS name
FROM pg_class c
JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE n.nspname = :schema AND c.relname = ANY(CAST(:names AS text[]))
  AND EXISTS (
      SELECT 1 FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid
      WHERE l.locktype = 'relation' AND l.granted AND a.backend_type = 'autovacuum worker'
        AND l.relation IN (c.oid, c.reltoastrelid)
        AND a.query NOT LIKE '%to prevent wraparound%'
  )
ORDER BY c.relname

-- name: wait_past_deadlock_check
-- This transaction's lock waits: PostgreSQL's deadlock_timeout and half a second (autovacuum
-- yields to a lock request that has waited deadlock_timeout).
SELECT set_config('lock_timeout', CAST(CAST(extract(epoch FROM
           CAST(current_setting('deadlock_timeout') AS interval)) * 1000 + 500 AS int) AS text)
           || 'ms', true) AS lock_timeout

-- name: mirrored
-- Whether mirroring triggers sit on the source tables of :schema.
SELECT EXISTS (
    SELECT 1 FROM pg_trigger t
    JOIN pg_class c ON c.oid = t.tgrelid
    JOIN pg_namespace n ON n.oid = c.relnamespace
    WHERE t.tgname = 'duejobs_mirror' AND n.nspname = :schema
) AS mirrored

-- name: conversion_left
-- What a conversion stopped from outside leaves: mirroring triggers on the source tables of
-- :schema, or its staging schema.
SELECT EXISTS (
           SELECT 1 FROM pg_trigger t
           JOIN pg_class c ON c.oid = t.tgrelid
           JOIN pg_namespace n ON n.oid = c.relnamespace
           WHERE t.tgname = 'duejobs_mirror' AND n.nspname = :schema
       ) OR EXISTS (SELECT 1 FROM pg_namespace WHERE nspname = :staging) AS left_behind
