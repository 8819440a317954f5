-- SQL that runs unchanged on one PostgreSQL server and on Citus, where the
-- store's tables are distributed by user_id (see docs/ARCHITECTURE.md,
-- "Scaling out on Citus"). Each change keeps what it replaces on a single
-- node: the same plans, the same answers.
--
-- 1. Row-level security policies call functions instead of holding
--    subqueries, which Citus refuses in policies on distributed tables.
--    Both functions have SQL-standard bodies, so the planner inlines them
--    and each subquery is still an InitPlan run once per statement.
-- 2. The owner is recognised by the owner of adk_store_policy, not of
--    adk_sessions: a policy on adk_sessions naming adk_sessions is a
--    dependency cycle that Citus cannot distribute.
-- 3. ON CONFLICT … DO UPDATE takes updated_at from EXCLUDED (the row's
--    own now() default): Citus refuses non-immutable functions there.
-- 4. The two audit triggers write their log only where the log table
--    exists. On Citus the logs stay on the coordinator, while the triggers
--    fire on every node's copy of the reference table they guard.
-- 5. A role binding holds the role's name beside its oid. On Citus a role
--    has a different oid on every node (roles are propagated by name), so
--    the copies of adk_role_apps on the workers can only recognise it by
--    name; on one server the oid still decides, as before, so a role
--    dropped and made again under the same name inherits nothing there.

SET LOCAL lock_timeout = '5s';

-- Whether the querying role may see every row: it owns the store (or is a
-- member of the owning role).
CREATE FUNCTION adk_is_store_owner() RETURNS boolean
LANGUAGE sql STABLE
RETURN (SELECT pg_catalog.pg_has_role(current_user, c.relowner, 'MEMBER'::text)
          FROM pg_catalog.pg_class c WHERE c.oid = 'adk_store_policy'::regclass);

-- adk_acting_app() once per statement: the SECURITY DEFINER function itself
-- cannot be inlined and would run once per row.
CREATE FUNCTION adk_visible_app() RETURNS text
LANGUAGE sql STABLE
RETURN (SELECT adk_acting_app());

-- Row-level security evaluates these as the querying role; they answer only
-- about that role.
GRANT EXECUTE ON FUNCTION adk_is_store_owner() TO PUBLIC;
GRANT EXECUTE ON FUNCTION adk_visible_app() TO PUBLIC;

CREATE OR REPLACE FUNCTION adk_protect_tenant_table(p_table regclass) RETURNS boolean
LANGUAGE plpgsql
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

DO $$
DECLARE
    t regclass;
BEGIN
    FOR t IN SELECT p.polrelid::regclass FROM pg_catalog.pg_policy p WHERE p.polname = 'adk_tenant_isolation' LOOP
        EXECUTE pg_catalog.format('ALTER POLICY adk_tenant_isolation ON %s
                                       USING (adk_is_store_owner() OR app_name = adk_visible_app())
                                       WITH CHECK (adk_is_store_owner() OR app_name = adk_visible_app())', t);
    END LOOP;
    FOR t IN SELECT p.polrelid::regclass FROM pg_catalog.pg_policy p WHERE p.polname = 'adk_owner_only' LOOP
        EXECUTE pg_catalog.format('ALTER POLICY adk_owner_only ON %s USING (adk_is_store_owner())', t);
    END LOOP;
END;
$$;

-- The state upserts of an append and of a create, with updated_at from the
-- inserted row. Rewritten in place rather than restated: the bodies are
-- long and the change is one expression; the counts make the migration fail
-- if a body is not the one this was written against.
DO $$
DECLARE
    f        regprocedure;
    expected integer;
    body     text;
    found    integer;
BEGIN
    FOR f, expected IN VALUES
        ('adk_append_event(text, text, text, text, text, text, text, bigint, jsonb, jsonb, jsonb, jsonb, bigint, interval)'::regprocedure, 2),
        ('adk_create_session(text, text, text, text, jsonb, interval, jsonb, jsonb, text, jsonb)'::regprocedure, 2)
    LOOP
        body := pg_catalog.pg_get_functiondef(f);
        found := (pg_catalog.length(body) - pg_catalog.length(pg_catalog.replace(body, 'updated_at = pg_catalog.now()', '')))
                 / pg_catalog.length('updated_at = pg_catalog.now()');
        IF found <> expected THEN
            RAISE EXCEPTION '% has % upserts setting updated_at = now(), expected %', f, found, expected;
        END IF;
        EXECUTE pg_catalog.replace(body, 'updated_at = pg_catalog.now()', 'updated_at = EXCLUDED.updated_at');
    END LOOP;
END;
$$;

CREATE OR REPLACE FUNCTION adk_store_policy_guard() RETURNS trigger
LANGUAGE plpgsql
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

CREATE OR REPLACE FUNCTION adk_role_apps_log() RETURNS trigger
LANGUAGE plpgsql
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

-- 5. Bindings by name on Citus. A binding of a role dropped since keeps a
--    NULL name: it binds nobody, as its oid already did.
ALTER TABLE adk_role_apps ADD COLUMN role_name name;
UPDATE adk_role_apps b SET role_name = r.rolname FROM pg_catalog.pg_roles r WHERE r.oid = b.role_oid;

-- Whether role oids are this node's own: false on a Citus node, where the
-- bindings were written with the coordinator's oids. One expression, so the
-- callers below inline it.
CREATE FUNCTION adk_role_oids_are_local() RETURNS boolean
LANGUAGE sql STABLE
RETURN pg_catalog.to_regclass('pg_catalog.pg_dist_node') IS NULL;

-- Does the binding row (p_role_oid, p_role_name) name the acting role? The
-- rows are read by the callers: Citus cannot run an SQL-standard function
-- that has arguments and reads a distributed or reference table ("syntax
-- error at or near RETURN" from its empty source text).
CREATE FUNCTION adk_binding_is_acting_role(p_role_oid oid, p_role_name name) RETURNS boolean
LANGUAGE sql STABLE
RETURN CASE WHEN adk_role_oids_are_local() THEN p_role_oid = adk_acting_role()
            ELSE p_role_name = adk_acting_role_name() END;

-- Called only inside SECURITY DEFINER functions, as the owner.
REVOKE EXECUTE ON FUNCTION adk_role_oids_are_local() FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION adk_binding_is_acting_role(oid, name) FROM PUBLIC;

CREATE OR REPLACE FUNCTION adk_acting_app() RETURNS text
LANGUAGE sql STABLE SECURITY DEFINER
BEGIN ATOMIC
    SELECT t.app
    FROM (SELECT nullif(pg_catalog.current_setting('adk.app_name', true), '') AS app) t
    WHERE EXISTS (SELECT 1 FROM adk_role_apps b
                  WHERE adk_binding_is_acting_role(b.role_oid, b.role_name)
                    AND (b.app_name = t.app OR b.app_name IS NULL));
END;

CREATE OR REPLACE FUNCTION adk_tenant_allows(p_tenant text, p_app_name text) RETURNS boolean
LANGUAGE plpgsql
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

-- Restated functions keep the path pin migration 8 gave every
-- function without an SQL-standard body.
DO $$
DECLARE
    f regprocedure;
BEGIN
    FOREACH f IN ARRAY ARRAY['adk_protect_tenant_table(regclass)', 'adk_store_policy_guard()', 'adk_role_apps_log()',
                             'adk_tenant_allows(text, text)',
                             'adk_append_event(text, text, text, text, text, text, text, bigint, jsonb, jsonb, jsonb, jsonb, bigint, interval)',
                             'adk_create_session(text, text, text, text, jsonb, interval, jsonb, jsonb, text, jsonb)']::regprocedure[] LOOP
        EXECUTE pg_catalog.format('ALTER FUNCTION %s SET search_path = pg_catalog, %I, pg_temp', f, pg_catalog.current_schema());
    END LOOP;
END;
$$;

