-- Who is acting and for which app: the role bindings (adk_role_apps) read
-- by row-level security and by every SECURITY DEFINER entry point, the
-- tenant check those run first, and the log of binding changes.
--
-- Installed after every migrate, in one transaction with the other files
-- (crates/schema/src/replaceable.rs). Each function is stated whole, with
-- its SET clauses and grants: change it here, not in a migration.

-- The role the session acts as. `role` is 'none' until a SET ROLE. One
-- expression, so a caller inlines it: it runs on every store call.
CREATE OR REPLACE FUNCTION adk_acting_role() RETURNS oid
LANGUAGE sql STABLE
RETURN pg_catalog.to_regrole(pg_catalog.quote_ident(
    CASE WHEN pg_catalog.current_setting('role') = 'none' THEN session_user::text
         ELSE pg_catalog.current_setting('role') END))::oid;
REVOKE EXECUTE ON FUNCTION adk_acting_role() FROM PUBLIC;

-- The acting role's name, for the audit record (inside a SECURITY DEFINER
-- function current_user is the owner).
CREATE OR REPLACE FUNCTION adk_acting_role_name() RETURNS name
    LANGUAGE sql STABLE
    RETURN coalesce((SELECT r.rolname FROM pg_catalog.pg_roles r WHERE r.oid = adk_acting_role()), session_user);
REVOKE EXECUTE ON FUNCTION adk_acting_role_name() FROM PUBLIC;

-- Whether role oids are this node's own: false on a Citus node, where the
-- bindings were written with the coordinator's oids. One expression, so the
-- callers below inline it.
CREATE OR REPLACE FUNCTION adk_role_oids_are_local() RETURNS boolean
LANGUAGE sql STABLE
RETURN pg_catalog.to_regclass('pg_catalog.pg_dist_node') IS NULL;
REVOKE EXECUTE ON FUNCTION adk_role_oids_are_local() FROM PUBLIC;

-- Does the binding row (p_role_oid, p_role_name) name the acting role? The
-- rows are read by the callers: Citus cannot run an SQL-standard function
-- that has arguments and reads a distributed or reference table ("syntax
-- error at or near RETURN" from its empty source text).
CREATE OR REPLACE FUNCTION adk_binding_is_acting_role(p_role_oid oid, p_role_name name) RETURNS boolean
LANGUAGE sql STABLE
RETURN CASE WHEN adk_role_oids_are_local() THEN p_role_oid = adk_acting_role()
            ELSE p_role_name = adk_acting_role_name() END;
REVOKE EXECUTE ON FUNCTION adk_binding_is_acting_role(p_role_oid oid, p_role_name name) FROM PUBLIC;

CREATE OR REPLACE FUNCTION adk_acting_app() RETURNS text
LANGUAGE sql STABLE SECURITY DEFINER
BEGIN ATOMIC
    SELECT t.app
    FROM (SELECT nullif(pg_catalog.current_setting('adk.app_name', true), '') AS app) t
    WHERE EXISTS (SELECT 1 FROM adk_role_apps b
                  WHERE adk_binding_is_acting_role(b.role_oid, b.role_name)
                    AND (b.app_name = t.app OR b.app_name IS NULL));
END;
REVOKE EXECUTE ON FUNCTION adk_acting_app() FROM PUBLIC;
GRANT EXECUTE ON FUNCTION adk_acting_app() TO PUBLIC;

-- adk_acting_app() once per statement: the SECURITY DEFINER function itself
-- cannot be inlined and would run once per row.
CREATE OR REPLACE FUNCTION adk_visible_app() RETURNS text
LANGUAGE sql STABLE
RETURN (SELECT adk_acting_app());
REVOKE EXECUTE ON FUNCTION adk_visible_app() FROM PUBLIC;
GRANT EXECUTE ON FUNCTION adk_visible_app() TO PUBLIC;

CREATE OR REPLACE FUNCTION adk_tenant_allows(p_tenant text, p_app_name text) RETURNS boolean
LANGUAGE plpgsql
SET search_path = pg_catalog, :"store_schema", pg_temp
AS $$
DECLARE
    acting oid;
BEGIN
    IF p_tenant IS NOT NULL AND p_tenant IS DISTINCT FROM p_app_name THEN
        RETURN false;
    END IF;
    acting := adk_acting_role();
    IF p_tenant IS NULL THEN
        RETURN coalesce(pg_catalog.pg_has_role(acting, current_user, 'MEMBER'::text), false);
    END IF;
    IF NOT EXISTS (SELECT 1 FROM adk_role_apps b
                   WHERE adk_binding_is_acting_role(b.role_oid, b.role_name)
                     AND (b.app_name = p_tenant OR b.app_name IS NULL))
       AND NOT coalesce(pg_catalog.pg_has_role(acting, current_user, 'MEMBER'::text), false) THEN
        RETURN false;
    END IF;
    PERFORM pg_catalog.set_config('adk.app_name'::text, p_tenant, true);
    RETURN true;
END;
$$;
REVOKE EXECUTE ON FUNCTION adk_tenant_allows(p_tenant text, p_app_name text) FROM PUBLIC;

-- The same, for operations that write, called when adk_tenant_allows said
-- no: refusing is an error, so nothing is written and the caller learns why.
CREATE OR REPLACE FUNCTION adk_tenant_require(p_tenant text, p_app_name text) RETURNS void
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, :"store_schema", pg_temp
AS $$
BEGIN
    IF NOT adk_tenant_allows(p_tenant, p_app_name) THEN
        RAISE EXCEPTION 'permission denied for app %: role % may not act for it',
            coalesce(p_app_name, '(none)'),
            coalesce((SELECT r.rolname FROM pg_roles r WHERE r.oid = adk_acting_role()), '(unknown)')
            USING ERRCODE = 'insufficient_privilege',
                  HINT = CASE WHEN p_tenant IS NULL
                              THEN 'a role that does not own the store must name its tenant'
                              ELSE 'bind the role to the app: adk-pg service-role ROLE --app APP' END;
    END IF;
END;
$$;
REVOKE EXECUTE ON FUNCTION adk_tenant_require(p_tenant text, p_app_name text) FROM PUBLIC;

CREATE OR REPLACE FUNCTION adk_protect_tenant_table(p_table regclass) RETURNS boolean
LANGUAGE plpgsql
SET search_path = pg_catalog, :"store_schema", pg_temp
AS $$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_class c WHERE c.oid = p_table AND c.relrowsecurity AND c.relforcerowsecurity)
       AND EXISTS (SELECT 1 FROM pg_policy p WHERE p.polrelid = p_table AND p.polname = 'adk_tenant_isolation') THEN
        RETURN false;
    END IF;
    EXECUTE pg_catalog.format('ALTER TABLE %s ENABLE ROW LEVEL SECURITY, FORCE ROW LEVEL SECURITY', p_table);
    IF NOT EXISTS (SELECT 1 FROM pg_policy p WHERE p.polrelid = p_table AND p.polname = 'adk_tenant_isolation') THEN
        EXECUTE pg_catalog.format('CREATE POLICY adk_tenant_isolation ON %s
                                       USING (adk_is_store_owner() OR app_name = adk_visible_app())
                                       WITH CHECK (adk_is_store_owner() OR app_name = adk_visible_app())',
                                  p_table);
    END IF;
    RETURN true;
END;
$$;
REVOKE EXECUTE ON FUNCTION adk_protect_tenant_table(p_table regclass) FROM PUBLIC;

CREATE OR REPLACE FUNCTION adk_role_apps_log() RETURNS trigger
LANGUAGE plpgsql
SET search_path = pg_catalog, :"store_schema", pg_temp
AS $$
BEGIN
    IF pg_catalog.to_regclass('adk_role_app_changes') IS NULL THEN
        RETURN NULL;
    END IF;
    -- An UPDATE is logged as what it amounts to: one unbinding, one binding.
    IF TG_OP IN ('UPDATE', 'DELETE') THEN
        INSERT INTO adk_role_app_changes (role_oid, role_name, app_name, change)
        SELECT OLD.role_oid, r.rolname, OLD.app_name, 'unbound' FROM (SELECT NULL) one
        LEFT JOIN pg_roles r ON r.oid = OLD.role_oid;
    END IF;
    IF TG_OP IN ('UPDATE', 'INSERT') THEN
        INSERT INTO adk_role_app_changes (role_oid, role_name, app_name, change)
        SELECT NEW.role_oid, r.rolname, NEW.app_name, 'bound' FROM (SELECT NULL) one
        LEFT JOIN pg_roles r ON r.oid = NEW.role_oid;
    END IF;
    RETURN NULL;
END;
$$;
REVOKE EXECUTE ON FUNCTION adk_role_apps_log() FROM PUBLIC;

-- A function the files make, or make anew with another signature, starts
-- without the service roles' grants: this gives it to every role (other
-- than the owner) that may run `p_like`, so an upgraded store keeps working
-- as the roles it runs as without re-running their setup.
CREATE OR REPLACE FUNCTION adk_grant_like(p_function regprocedure, p_like regprocedure) RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, :"store_schema", pg_temp
AS $$
DECLARE
    r regrole;
BEGIN
    FOR r IN SELECT DISTINCT a.grantee::regrole
               FROM pg_catalog.pg_proc p
              CROSS JOIN LATERAL pg_catalog.aclexplode(p.proacl) a
              WHERE p.oid = p_like
                AND a.privilege_type = 'EXECUTE' AND a.grantee <> p.proowner AND a.grantee <> 0 LOOP
        EXECUTE pg_catalog.format('GRANT EXECUTE ON FUNCTION %s TO %s', p_function, r);
    END LOOP;
END;
$$;
REVOKE EXECUTE ON FUNCTION adk_grant_like(p_function regprocedure, p_like regprocedure) FROM PUBLIC;
