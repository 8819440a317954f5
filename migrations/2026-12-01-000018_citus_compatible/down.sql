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
                            USING ((SELECT pg_catalog.pg_has_role(current_user, c.relowner, ''MEMBER''::text) FROM pg_catalog.pg_class c WHERE c.oid = ''adk_sessions''::regclass) OR app_name = (SELECT adk_acting_app()))
                            WITH CHECK ((SELECT pg_catalog.pg_has_role(current_user, c.relowner, ''MEMBER''::text) FROM pg_catalog.pg_class c WHERE c.oid = ''adk_sessions''::regclass) OR app_name = (SELECT adk_acting_app()))',
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
                            USING ((SELECT pg_catalog.pg_has_role(current_user, c.relowner, ''MEMBER''::text) FROM pg_catalog.pg_class c WHERE c.oid = ''adk_sessions''::regclass) OR app_name = (SELECT adk_acting_app()))
                            WITH CHECK ((SELECT pg_catalog.pg_has_role(current_user, c.relowner, ''MEMBER''::text) FROM pg_catalog.pg_class c WHERE c.oid = ''adk_sessions''::regclass) OR app_name = (SELECT adk_acting_app()))', t);
    END LOOP;
    FOR t IN SELECT p.polrelid::regclass FROM pg_catalog.pg_policy p WHERE p.polname = 'adk_owner_only' LOOP
        EXECUTE pg_catalog.format('ALTER POLICY adk_owner_only ON %s
            USING ((SELECT pg_catalog.pg_has_role(current_user, c.relowner, ''MEMBER''::text) FROM pg_catalog.pg_class c WHERE c.oid = ''adk_sessions''::regclass))', t);
    END LOOP;
END;
$$;

DROP FUNCTION adk_visible_app();
DROP FUNCTION adk_is_store_owner();

DO $$
DECLARE
    f regprocedure;
BEGIN
    FOREACH f IN ARRAY ARRAY['adk_append_event(text, text, text, text, text, text, text, bigint, jsonb, jsonb, jsonb, jsonb, bigint, interval)',
                             'adk_create_session(text, text, text, text, jsonb, interval, jsonb, jsonb, text, jsonb)']::regprocedure[] LOOP
        EXECUTE pg_catalog.replace(pg_catalog.pg_get_functiondef(f), 'updated_at = EXCLUDED.updated_at', 'updated_at = pg_catalog.now()');
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
    NEW.updated_at := pg_catalog.now();
    NEW.updated_by := current_user;
    INSERT INTO adk_store_policy_changes (before, after)
    VALUES (pg_catalog.to_jsonb(OLD) OPERATOR(pg_catalog.-) 'id'::text,
            pg_catalog.to_jsonb(NEW) OPERATOR(pg_catalog.-) 'id'::text);
    RETURN NEW;
END;
$$;

CREATE OR REPLACE FUNCTION adk_role_apps_log() RETURNS trigger
LANGUAGE plpgsql
AS $$
BEGIN
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

CREATE OR REPLACE FUNCTION adk_acting_app() RETURNS text
LANGUAGE sql STABLE SECURITY DEFINER
BEGIN ATOMIC
    SELECT t.app
    FROM (SELECT nullif(pg_catalog.current_setting('adk.app_name', true), '') AS app) t
    WHERE EXISTS (SELECT 1 FROM adk_role_apps b
                  WHERE b.role_oid = adk_acting_role() AND (b.app_name = t.app OR b.app_name IS NULL));
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
                   WHERE b.role_oid = acting AND (b.app_name = p_tenant OR b.app_name IS NULL))
       AND NOT coalesce(pg_catalog.pg_has_role(acting, current_user, 'MEMBER'::text), false) THEN
        RETURN false;
    END IF;
    PERFORM pg_catalog.set_config('adk.app_name'::text, p_tenant, true);
    RETURN true;
END;
$$;

DROP FUNCTION adk_binding_is_acting_role(oid, name);
DROP FUNCTION adk_role_oids_are_local();
ALTER TABLE adk_role_apps DROP COLUMN role_name;

DO $$
DECLARE
    f regprocedure;
BEGIN
    FOREACH f IN ARRAY ARRAY['adk_protect_tenant_table(regclass)', 'adk_store_policy_guard()', 'adk_role_apps_log()',
                             'adk_tenant_allows(text, text)']::regprocedure[] LOOP
        EXECUTE pg_catalog.format('ALTER FUNCTION %s SET search_path = pg_catalog, %I, pg_temp', f, pg_catalog.current_schema());
    END LOOP;
END;
$$;
