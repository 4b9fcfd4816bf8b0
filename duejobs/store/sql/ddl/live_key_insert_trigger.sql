-- The trigger that gives a new live row its key, run {timing} (AFTER, or BEFORE as revision
-- 0008 had it) the insert.
CREATE TRIGGER scheduled_jobs_key_insert {timing} INSERT ON {jobs}
    FOR EACH ROW WHEN (NEW.key IS NOT NULL AND NEW.status IN ('scheduled', 'running'))
    EXECUTE FUNCTION {keep}();
