-- The function of partitioned mode's live-key triggers (see duejobs/store/partition_keys.py):
-- {keep} the function, {keys} scheduled_job_keys, {jobs} scheduled_jobs, {index} the plain
-- schema's live-key index, whose error a held key raises. Identifiers are the only thing
-- filled in.
CREATE OR REPLACE FUNCTION {keep}() RETURNS trigger LANGUAGE plpgsql AS $fn$
DECLARE
    holder uuid;
BEGIN
    IF TG_OP <> 'INSERT' AND OLD.key IS NOT NULL AND OLD.status IN ('scheduled', 'running') THEN
        DELETE FROM {keys}
        WHERE tenant = OLD.tenant AND key = OLD.key AND schedule_id = OLD.id;
    END IF;
    IF TG_OP = 'DELETE' THEN
        RETURN OLD;
    END IF;
    IF NEW.key IS NULL OR NEW.status NOT IN ('scheduled', 'running') THEN
        RETURN NEW;
    END IF;
    LOOP
        INSERT INTO {keys} (tenant, key, schedule_id) VALUES (NEW.tenant, NEW.key, NEW.id)
        ON CONFLICT (tenant, key) DO NOTHING;
        IF FOUND THEN
            RETURN NEW;
        END IF;
        -- Held: lock the key's row, so that whoever holds it is settled until this commits.
        SELECT schedule_id INTO holder FROM {keys}
        WHERE tenant = NEW.tenant AND key = NEW.key FOR UPDATE;
        IF FOUND THEN
            EXIT WHEN holder <> NEW.id AND EXISTS (
                SELECT 1 FROM {jobs} WHERE id = holder AND status IN ('scheduled', 'running')
            );
            -- Its own key (its row written again), or one left by a row no longer live (a
            -- copy that lost to a newer write): it is this row's.
            UPDATE {keys} SET schedule_id = NEW.id WHERE tenant = NEW.tenant AND key = NEW.key;
            RETURN NEW;
        END IF;
        -- Freed since the insert looked: try again.
    END LOOP;
    IF TG_OP = 'INSERT' AND TG_WHEN = 'BEFORE' THEN
        RETURN NULL;  -- skipped, as revision 0008's statements expect
    END IF;
    RAISE unique_violation USING
        MESSAGE = 'duplicate key value violates unique constraint "{index}"',
        DETAIL = format('Key (tenant, key)=(%s, %s) already exists.', NEW.tenant, NEW.key),
        CONSTRAINT = '{index}';
END
$fn$;
