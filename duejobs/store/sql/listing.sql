-- Listing: pages of schedules by filter, in (due_at, id) order from a cursor. A NULL
-- parameter is no filter. Rows are read in four parts, each from an index that a schedule's
-- own life already writes (waiting to be pushed, pushed, running) or that it gets once, when
-- it finishes (migration 0007): listing adds no index write to scheduling, claiming or
-- running a schedule.

-- name: list_schedules
SELECT * FROM (
    ({{list_part(status = 'scheduled' AND queue_job_id IS NULL, CAST('{scheduled}' AS text[]), >, ASC)}})
    UNION ALL
    ({{list_part(status = 'scheduled' AND queue_job_id IS NOT NULL, CAST('{scheduled}' AS text[]), >, ASC)}})
    UNION ALL
    ({{list_part(status = 'running', CAST('{running}' AS text[]), >, ASC)}})
    UNION ALL
    ({{list_part(status IN ('succeeded', 'failed', 'cancelled'), CAST('{succeeded,failed,cancelled}' AS text[]), >, ASC)}})
) AS listed
ORDER BY due_at, id
LIMIT :limit

-- name: list_schedules_latest_first
SELECT * FROM (
    ({{list_part(status = 'scheduled' AND queue_job_id IS NULL, CAST('{scheduled}' AS text[]), <, DESC)}})
    UNION ALL
    ({{list_part(status = 'scheduled' AND queue_job_id IS NOT NULL, CAST('{scheduled}' AS text[]), <, DESC)}})
    UNION ALL
    ({{list_part(status = 'running', CAST('{running}' AS text[]), <, DESC)}})
    UNION ALL
    ({{list_part(status IN ('succeeded', 'failed', 'cancelled'), CAST('{succeeded,failed,cancelled}' AS text[]), <, DESC)}})
) AS listed
ORDER BY due_at DESC, id DESC
LIMIT :limit

-- name: recurring_ids
-- The recurring definitions of that name, of one tenant or of all: a list names them by
-- their ids, which the planner then sees (an id it would only learn while running hides how
-- many occurrences a definition has, and the index that finds them).
SELECT id FROM recurring_schedules WHERE name = :name AND {{tenant_filter}}
