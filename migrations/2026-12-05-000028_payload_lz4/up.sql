-- Event payloads compressed with lz4 instead of PostgreSQL's default pglz
-- (issue 35). Measured by the bench's TOAST section (crates/bench/src/
-- toast.rs, docs/ARCHITECTURE.md): on agent events of about 4 KB of JSON,
-- lz4 appends and reads faster and decompresses in less than half the
-- server time, for a few per cent more bytes.
--
-- SET COMPRESSION changes the catalog only: no partition is rewritten, and
-- every value stored keeps the method it was compressed with (each value
-- records its own), so rows written before stay pglz and are read as
-- before. PostgreSQL 15 does not carry SET COMPRESSION from a partitioned
-- table to its partitions, so each partition is named here (today's and
-- the premade days take lz4 for their next rows); a partition made later
-- (CREATE TABLE … PARTITION OF, by adk_ensure_event_partition and by
-- maintenance) takes its parent's method. A server built without lz4 is
-- left as it is.
--
-- Each ALTER is its own statement, run by the DO block: on Citus the text of
-- the statement is what goes on to the workers (their copy of each table
-- and the shards), and it must hold one statement. The parent is locked
-- first, as appends and reads lock it.

-- lock_timeout for this transaction by set_config, not SET LOCAL: on Citus
-- (citus.propagate_set_commands = local) a SET LOCAL is replayed on the
-- workers as the text of the whole query it came in, which is this file.
SELECT pg_catalog.set_config('lock_timeout', '5s', true);

DO $$
DECLARE
    part regclass;
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_settings
                   WHERE name = 'default_toast_compression' AND 'lz4' = ANY (enumvals)) THEN
        RAISE NOTICE 'this server was built without lz4: adk_events.payload keeps pglz';
        RETURN;
    END IF;
    EXECUTE 'ALTER TABLE adk_events ALTER COLUMN payload SET COMPRESSION lz4';
    FOR part IN SELECT i.inhrelid::regclass FROM pg_catalog.pg_inherits i
                WHERE i.inhparent = 'adk_events'::regclass ORDER BY i.inhrelid LOOP
        EXECUTE pg_catalog.format('ALTER TABLE %s ALTER COLUMN payload SET COMPRESSION lz4', part);
    END LOOP;
END
$$;
