-- Back to the server's default_toast_compression (pglz unless configured),
-- in the catalog only: values already compressed with lz4 stay lz4 and are
-- read as before.
SET LOCAL lock_timeout = '5s';

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
