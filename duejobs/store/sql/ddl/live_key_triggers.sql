-- The triggers that free a key when its row stops being live or takes another key.
CREATE TRIGGER scheduled_jobs_key_update AFTER UPDATE ON {jobs}
    FOR EACH ROW WHEN (
        OLD.key IS DISTINCT FROM NEW.key
        OR (OLD.status IN ('scheduled', 'running')) <> (NEW.status IN ('scheduled', 'running'))
    )
    EXECUTE FUNCTION {keep}();
CREATE TRIGGER scheduled_jobs_key_delete AFTER DELETE ON {jobs}
    FOR EACH ROW WHEN (OLD.key IS NOT NULL AND OLD.status IN ('scheduled', 'running'))
    EXECUTE FUNCTION {keep}();
