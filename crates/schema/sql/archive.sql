-- The archive tier's functions: the catalog as a bound role may read it,
-- and the guard that keeps restored copies read-only.
--
-- Installed after every migrate, in one transaction with the other files
-- (crates/schema/src/replaceable.rs). Each function is stated whole, with
-- its SET clauses and grants: change it here, not in a migration.

-- The archived objects of one app (or, for the owner, of every app when
-- p_app_name is NULL). A role bound to other apps is refused, as every
-- entry point refuses it; the catalog's row-level security would hide the
-- rows anyway, but a refusal says why.
CREATE OR REPLACE FUNCTION adk_archive_list(p_tenant text, p_app_name text)
RETURNS TABLE (
    app_name       text,
    day            date,
    kind           text,
    part           integer,
    object_key     text,
    destination    text,
    rows           bigint,
    bytes          bigint,
    sha256         bytea,
    format_version integer,
    day_events     bigint,
    archived_at    timestamptz,
    archived_by    name,
    verified_at    timestamptz
)
LANGUAGE plpgsql STABLE SECURITY DEFINER
SET search_path = pg_catalog, :"store_schema", pg_temp
AS $$
BEGIN
    IF p_app_name IS NULL THEN
        IF NOT adk_tenant_allows(NULL, NULL) THEN
            RAISE EXCEPTION 'permission denied: only the store''s owner lists every app''s archive'
                USING ERRCODE = 'insufficient_privilege', HINT = 'name the app: adk-pg archive list --app APP';
        END IF;
    ELSIF NOT adk_tenant_allows(p_tenant, p_app_name) THEN
        PERFORM adk_tenant_require(p_tenant, p_app_name);
    END IF;
    RETURN QUERY
        SELECT o.app_name, o.day, o.kind, o.part, o.object_key, o.destination, o.rows, o.bytes, o.sha256,
               o.format_version, o.day_events, o.archived_at, o.archived_by, o.verified_at
          FROM adk_archive_objects o
         WHERE p_app_name IS NULL OR o.app_name = p_app_name
         ORDER BY o.app_name, o.day, o.kind, o.part;
END;
$$;
REVOKE EXECUTE ON FUNCTION adk_archive_list(p_tenant text, p_app_name text) FROM PUBLIC;
SELECT adk_grant_like('adk_archive_list(text, text)', 'adk_get_session(text, text, text, text, bigint, bigint)');

-- A restored copy is evidence: nothing changes it but the restore that
-- loads it and the erasure that must reach it, which say so for their own
-- transaction by setting adk.archive_writer to 'on' locally.
CREATE OR REPLACE FUNCTION adk_archive_read_only() RETURNS trigger
LANGUAGE plpgsql
SET search_path = pg_catalog, :"store_schema", pg_temp
AS $$
BEGIN
    IF pg_catalog.current_setting('adk.archive_writer', true) IS DISTINCT FROM 'on' THEN
        RAISE EXCEPTION 'a day restored from the archive is read-only (%.%)', TG_TABLE_SCHEMA, TG_TABLE_NAME
            USING ERRCODE = 'read_only_sql_transaction',
                  HINT = 'restore it again with adk-pg archive restore; erase a user with adk-pg erase-user';
    END IF;
    RETURN NULL;
END;
$$;
REVOKE EXECUTE ON FUNCTION adk_archive_read_only() FROM PUBLIC;
