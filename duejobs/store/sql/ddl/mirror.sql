-- A conversion's mirror of one source table {source} into its staging copy {target} (see
-- duejobs/store/conversion.py): {function} the trigger's function; {keys} the primary key's
-- columns, {old_keys} them as OLD.; {columns} every column, {new_columns} them as NEW.;
-- {rest} the others and {excluded} them as EXCLUDED. Identifiers are the only thing filled in.
CREATE FUNCTION {function}() RETURNS trigger LANGUAGE plpgsql AS $fn$
BEGIN
    IF TG_OP = 'DELETE' THEN
        DELETE FROM {target} WHERE ({keys}) = ({old_keys});
        RETURN NULL;
    END IF;
    INSERT INTO {target} ({columns}) OVERRIDING SYSTEM VALUE VALUES ({new_columns})
    ON CONFLICT ({keys}) DO UPDATE SET ({rest}) = ROW({excluded});
    RETURN NULL;
END
$fn$;
CREATE TRIGGER duejobs_mirror AFTER INSERT OR UPDATE OR DELETE ON {source}
    FOR EACH ROW EXECUTE FUNCTION {function}();
