-- The store policy's reading helpers and the guard on its one row: only
-- the owner changes it, and every change is logged.
--
-- Installed after every migrate, in one transaction with the other files
-- (crates/schema/src/replaceable.rs). Each function is stated whole, with
-- its SET clauses and grants: change it here, not in a migration.

-- An interval as an exact number of seconds (a day is 24 hours, a month 30
-- days, so a year 360), so `timestamptz + interval` never depends on
-- TimeZone or DST. extract(epoch) counts a year as 365.25 days; the
-- correction makes it agree with the Rust reading of the same row.
CREATE OR REPLACE FUNCTION adk_policy_seconds(d interval) RETURNS interval
    LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
    RETURN make_interval(secs => extract(epoch FROM d) - extract(year FROM d) * 5.25 * 86400);
REVOKE EXECUTE ON FUNCTION adk_policy_seconds(d interval) FROM PUBLIC;

-- Whether the querying role may see every row: it owns the store (or is a
-- member of the owning role).
CREATE OR REPLACE FUNCTION adk_is_store_owner() RETURNS boolean
LANGUAGE sql STABLE
RETURN (SELECT pg_catalog.pg_has_role(current_user, c.relowner, 'MEMBER'::text)
          FROM pg_catalog.pg_class c WHERE c.oid = 'adk_store_policy'::regclass);
REVOKE EXECUTE ON FUNCTION adk_is_store_owner() FROM PUBLIC;
GRANT EXECUTE ON FUNCTION adk_is_store_owner() TO PUBLIC;

CREATE OR REPLACE FUNCTION adk_store_policy_guard() RETURNS trigger
LANGUAGE plpgsql
SET search_path = pg_catalog, :"store_schema", pg_temp
AS $$
BEGIN
    IF TG_OP = 'DELETE' THEN
        RAISE EXCEPTION 'the store policy row cannot be deleted; change it with adk-pg policy set'
            USING ERRCODE = 'restrict_violation';
    END IF;
    -- The store's own updates set updated_at (Citus evaluates it once, on
    -- the coordinator, so every copy agrees); a hand-written UPDATE that
    -- leaves it alone gets this node's clock.
    IF NEW.updated_at IS NOT DISTINCT FROM OLD.updated_at THEN
        NEW.updated_at := pg_catalog.now();
    END IF;
    NEW.updated_by := current_user;
    IF pg_catalog.to_regclass('adk_store_policy_changes') IS NOT NULL THEN
        INSERT INTO adk_store_policy_changes (before, after)
        VALUES (pg_catalog.to_jsonb(OLD) OPERATOR(pg_catalog.-) 'id'::text,
                pg_catalog.to_jsonb(NEW) OPERATOR(pg_catalog.-) 'id'::text);
    END IF;
    RETURN NEW;
END;
$$;
REVOKE EXECUTE ON FUNCTION adk_store_policy_guard() FROM PUBLIC;
