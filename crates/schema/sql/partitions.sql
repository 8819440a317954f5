-- The daily partitions of adk_events: their names, making one (and the
-- days the policy premakes), and the tenant guard every new one gets.
--
-- Installed after every migrate, in one transaction with the other files
-- (crates/schema/src/replaceable.rs). Each function is stated whole, with
-- its SET clauses and grants: change it here, not in a migration.

-- The name of the partition that holds one UTC day.
CREATE OR REPLACE FUNCTION adk_event_partition_name(day date) RETURNS text
    LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
    RETURN 'adk_events_p' || to_char(day::timestamp, 'YYYYMMDD');
REVOKE EXECUTE ON FUNCTION adk_event_partition_name(day date) FROM PUBLIC;

-- A new partition is protected in the transaction that creates it.
CREATE OR REPLACE FUNCTION adk_ensure_event_partition(day date) RETURNS boolean
    LANGUAGE plpgsql STRICT
SET lock_timeout = '5s'
SET search_path = pg_catalog, :"store_schema", pg_temp
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
    EXECUTE pg_catalog.format('CREATE TABLE %I.%I PARTITION OF adk_events FOR VALUES FROM (%L) TO (%L)',
                   schema, part, pg_catalog.to_char(day::timestamp, 'YYYY-MM-DD'), pg_catalog.to_char((day + 1)::timestamp, 'YYYY-MM-DD'));
    PERFORM adk_protect_tenant_table(pg_catalog.format('%I.%I', schema, part)::regclass);
    RETURN true;
EXCEPTION
    WHEN duplicate_table THEN
        RETURN false;
END;
$$;
REVOKE EXECUTE ON FUNCTION adk_ensure_event_partition(day date) FROM PUBLIC;

-- Creates the event partitions for today (UTC) through today + the policy's
-- premake_days that are missing; returns how many it made. It runs as the
-- tables' owner so that a store connected as a non-owner service role is
-- never left without today's partition, and it takes no argument: a caller
-- can only make the days the policy asks for, never an arbitrary one.
CREATE OR REPLACE FUNCTION adk_premake_event_partitions() RETURNS integer
LANGUAGE plpgsql
SECURITY DEFINER
SET lock_timeout = '5s'
SET search_path = pg_catalog, :"store_schema", pg_temp
AS $$
DECLARE
    today date := (now() AT TIME ZONE 'UTC')::date;
    ahead integer;
    made  integer := 0;
BEGIN
    SELECT p.premake_days INTO ahead FROM adk_store_policy p;
    FOR offset_days IN 0 .. coalesce(ahead, 7) LOOP
        IF adk_ensure_event_partition(today + offset_days) THEN
            made := made + 1;
        END IF;
    END LOOP;
    RETURN made;
END;
$$;
REVOKE EXECUTE ON FUNCTION adk_premake_event_partitions() FROM PUBLIC;

-- Protects every partition of adk_events that is not yet: premade,
-- re-attached, or the legacy table a conversion attached. Returns how many
-- it changed. Maintenance and conversion call it after they attach.
CREATE OR REPLACE FUNCTION adk_protect_event_partitions() RETURNS integer
LANGUAGE plpgsql
SET search_path = pg_catalog, :"store_schema", pg_temp
AS $$
DECLARE
    changed integer := 0;
    part    regclass;
BEGIN
    FOR part IN SELECT i.inhrelid::regclass FROM pg_inherits i WHERE i.inhparent = 'adk_events'::regclass LOOP
        IF adk_protect_tenant_table(part) THEN
            changed := changed + 1;
        END IF;
    END LOOP;
    RETURN changed;
END;
$$;
REVOKE EXECUTE ON FUNCTION adk_protect_event_partitions() FROM PUBLIC;
