-- The store on Citus, installed right after sessions.sql on a database with
-- the citus extension (crates/schema/src/replaceable.rs). The switch that
-- sessions.sql defines as false is true here, so the create (sessions.sql)
-- and the append (append.sql) take their Citus branches. This is the first
-- variant installed after the switch's definition, and nothing calls the
-- functions that branch on it before the install commits.
CREATE OR REPLACE FUNCTION adk_on_citus() RETURNS boolean
 LANGUAGE sql IMMUTABLE PARALLEL SAFE
 SET search_path = pg_catalog, :"store_schema", pg_temp
AS $$ SELECT true $$;
REVOKE EXECUTE ON FUNCTION adk_on_citus() FROM PUBLIC;
