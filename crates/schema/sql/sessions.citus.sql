-- The create as Citus runs it on the user's worker, installed after the
-- base file's functions on a database with the citus extension
-- (crates/schema/src/replaceable.rs).
--
-- One server inserts and reads the shared state in one statement
-- (migration 21), a quarter more creates there. Citus rejects any subquery in an
-- INSERT, so here the create keeps the statements of migration 18: the
-- delete of an expired session holding the id, the policy read, the insert,
-- and a read (or an upsert) of each shared state.
--
-- Whoever changes sessions.sql's adk_create_session changes this body too: the
-- conformance and contract suites run on Citus against it.
CREATE OR REPLACE FUNCTION adk_create_session(p_tenant text, p_app_name text, p_user_id text, p_session_id text, p_state jsonb, p_ttl interval, p_user_delta jsonb, p_app_delta jsonb, p_display_name text DEFAULT NULL::text, p_labels jsonb DEFAULT '{}'::jsonb)
 RETURNS TABLE(created_at timestamp with time zone, updated_at timestamp with time zone, expires_at timestamp with time zone, user_state jsonb, app_state jsonb)
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path = pg_catalog, :"store_schema", pg_temp
AS $$
#variable_conflict use_column
DECLARE
    born  record;
    ttl   interval;
    u     jsonb;
    a     jsonb;
BEGIN
    IF NOT adk_tenant_allows(p_tenant, p_app_name) THEN
        PERFORM adk_tenant_require(p_tenant, p_app_name);
    END IF;
    DELETE FROM adk_sessions x
     WHERE x.app_name = p_app_name AND x.user_id = p_user_id AND x.session_id = p_session_id
       AND x.expires_at <= pg_catalog.now();
    SELECT least(adk_policy_seconds(p_ttl), adk_policy_seconds(p.default_ttl)) INTO ttl FROM adk_store_policy p;
    INSERT INTO adk_sessions (app_name, user_id, session_id, state, initial_state, expires_at, display_name, labels)
    VALUES (p_app_name, p_user_id, p_session_id, p_state, p_state, pg_catalog.now() + ttl, p_display_name,
            coalesce(p_labels, '{}'::jsonb))
    ON CONFLICT DO NOTHING
    RETURNING adk_sessions.created_at, adk_sessions.updated_at, adk_sessions.expires_at INTO born;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    IF p_user_delta <> '{}'::jsonb THEN
        INSERT INTO adk_user_states AS us (app_name, user_id, state)
        VALUES (p_app_name, p_user_id, p_user_delta)
        ON CONFLICT (app_name, user_id) DO UPDATE SET state = us.state || EXCLUDED.state, updated_at = EXCLUDED.updated_at
        RETURNING us.state INTO u;
    ELSE
        SELECT us.state INTO u FROM adk_user_states us WHERE us.app_name = p_app_name AND us.user_id = p_user_id;
    END IF;
    IF p_app_delta <> '{}'::jsonb THEN
        INSERT INTO adk_app_states AS aps (app_name, state)
        VALUES (p_app_name, p_app_delta)
        ON CONFLICT (app_name) DO UPDATE SET state = aps.state || EXCLUDED.state, updated_at = EXCLUDED.updated_at
        RETURNING aps.state INTO a;
    ELSE
        SELECT aps.state INTO a FROM adk_app_states aps WHERE aps.app_name = p_app_name;
    END IF;
    RETURN QUERY SELECT born.created_at, born.updated_at, born.expires_at, u, a;
END;
$$;

REVOKE EXECUTE ON FUNCTION adk_create_session(text, text, text, text, jsonb, interval, jsonb, jsonb, text, jsonb) FROM PUBLIC;
