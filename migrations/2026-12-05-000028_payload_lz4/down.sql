-- Back to the server's default_toast_compression (pglz unless configured),
-- in the catalog only: values already compressed with lz4 stay lz4 and are
-- read as before.
-- lock_timeout for this transaction by set_config, not SET LOCAL: on Citus
-- (citus.propagate_set_commands = local) a SET LOCAL is replayed on the
-- workers as the text of the whole query it came in, which is this file.
SELECT pg_catalog.set_config('lock_timeout', '5s', true);

DO $$
DECLARE
    part regclass;
BEGIN
    EXECUTE 'ALTER TABLE adk_events ALTER COLUMN payload SET COMPRESSION default';
    FOR part IN SELECT i.inhrelid::regclass FROM pg_catalog.pg_inherits i
                WHERE i.inhparent = 'adk_events'::regclass ORDER BY i.inhrelid LOOP
        EXECUTE pg_catalog.format('ALTER TABLE %s ALTER COLUMN payload SET COMPRESSION default', part);
    END LOOP;
END
$$;
