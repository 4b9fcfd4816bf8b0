-- The schema's revision, what a service asks at its start (duejobs/store/revision.py).

-- name: schema_revision
-- The revision `duejobs migrate` last brought duejobs' tables to (Alembic's own table).
SELECT version_num FROM /*schema*/duejobs_alembic_version
