-- Daily partitions of adk_events are named adk_events_pYYYYMMDD and cover
-- [day, day + 1). These helpers are what tests and ad-hoc operators call;
-- `adk-pg maintain` issues the same DDL itself, with its own lock_timeout
-- and retries.

-- The name of the partition that holds one UTC day.
CREATE FUNCTION adk_event_partition_name(day date) RETURNS text
    LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
    RETURN 'adk_events_p' || to_char(day::timestamp, 'YYYYMMDD');

-- Creates the partition for `day` unless it exists; returns true when it made
-- one. Safe to call concurrently: a racing creator's table is accepted.
CREATE FUNCTION adk_ensure_event_partition(day date) RETURNS boolean
    LANGUAGE plpgsql STRICT
    SET lock_timeout = '5s'
AS $$
DECLARE
    part   text := adk_event_partition_name(day);
    schema name;
BEGIN
    SELECT n.nspname INTO schema
    FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
    WHERE c.oid = 'adk_events'::regclass;

    IF EXISTS (SELECT 1 FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
               WHERE c.relname = part AND n.nspname = schema) THEN
        RETURN false;
    END IF;
    EXECUTE format('CREATE TABLE %I.%I PARTITION OF adk_events FOR VALUES FROM (%L) TO (%L)',
                   schema, part, to_char(day::timestamp, 'YYYY-MM-DD'), to_char((day + 1)::timestamp, 'YYYY-MM-DD'));
    RETURN true;
EXCEPTION
    WHEN duplicate_table THEN
        RETURN false;
END;
$$;
