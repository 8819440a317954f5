SET LOCAL lock_timeout = '5s';

-- The create's common path as one statement, as the append's is (migration
-- 10): the insert takes its expiry from the policy and returns the live
-- user and app state in the same statement.
--
-- The body before ran six statements on every create: a delete of an
-- expired session holding the id, the policy read, the insert, and a read
-- (or an upsert) of each shared state. Through pgbench on one server,
-- medians of nine interleaved rounds of 2,000 creates: 1,603/s before,
-- 2,012/s with one statement, 2,292/s for a bare insert. An expired
-- session holding the id is now looked for only when the insert found the
-- id taken; that path, and the rare create that carries initial user or
-- app state, run the statements of the body before, written out after the
-- common path (a retry loop around one insert cost most of the gain).
--
-- Citus rejects any subquery in an INSERT, so the distribution step gives
-- Citus its own body (crates/schema/src/citus_create.sql), the one before.

CREATE OR REPLACE FUNCTION adk_create_session(p_tenant text, p_app_name text, p_user_id text, p_session_id text, p_state jsonb, p_ttl interval, p_user_delta jsonb, p_app_delta jsonb, p_display_name text DEFAULT NULL::text, p_labels jsonb DEFAULT '{}'::jsonb)
 RETURNS TABLE(created_at timestamp with time zone, updated_at timestamp with time zone, expires_at timestamp with time zone, user_state jsonb, app_state jsonb)
 LANGUAGE plpgsql
 SECURITY DEFINER
AS $$
#variable_conflict use_column
BEGIN
    IF NOT adk_tenant_allows(p_tenant, p_app_name) THEN
        PERFORM adk_tenant_require(p_tenant, p_app_name);
    END IF;
    IF p_user_delta = '{}'::jsonb AND p_app_delta = '{}'::jsonb THEN
        INSERT INTO adk_sessions AS s (app_name, user_id, session_id, state, initial_state, expires_at, display_name, labels)
        VALUES (p_app_name, p_user_id, p_session_id, p_state, p_state,
                pg_catalog.now() + (SELECT least(adk_policy_seconds(p_ttl), adk_policy_seconds(p.default_ttl))
                                      FROM adk_store_policy p),
                p_display_name, coalesce(p_labels, '{}'::jsonb))
        ON CONFLICT DO NOTHING
        RETURNING s.created_at, s.updated_at, s.expires_at,
                  (SELECT us.state FROM adk_user_states us WHERE us.app_name = p_app_name AND us.user_id = p_user_id),
                  (SELECT aps.state FROM adk_app_states aps WHERE aps.app_name = p_app_name)
        INTO created_at, updated_at, expires_at, user_state, app_state;
        IF FOUND THEN
            RETURN NEXT;
            RETURN;
        END IF;
    END IF;
    -- The rare path: the id was taken, or the create carries initial user
    -- or app state. An expired session holding the id is replaced: deleted
    -- in this transaction, so the insert no longer sees it.
    DELETE FROM adk_sessions x
     WHERE x.app_name = p_app_name AND x.user_id = p_user_id AND x.session_id = p_session_id
       AND x.expires_at <= pg_catalog.now();
    INSERT INTO adk_sessions AS s (app_name, user_id, session_id, state, initial_state, expires_at, display_name, labels)
    VALUES (p_app_name, p_user_id, p_session_id, p_state, p_state,
            pg_catalog.now() + (SELECT least(adk_policy_seconds(p_ttl), adk_policy_seconds(p.default_ttl))
                                  FROM adk_store_policy p),
            p_display_name, coalesce(p_labels, '{}'::jsonb))
    ON CONFLICT DO NOTHING
    RETURNING s.created_at, s.updated_at, s.expires_at INTO created_at, updated_at, expires_at;
    IF NOT FOUND THEN
        -- A live session has the id.
        RETURN;
    END IF;
    IF p_user_delta <> '{}'::jsonb THEN
        INSERT INTO adk_user_states AS us (app_name, user_id, state)
        VALUES (p_app_name, p_user_id, p_user_delta)
        ON CONFLICT (app_name, user_id) DO UPDATE SET state = us.state || EXCLUDED.state, updated_at = EXCLUDED.updated_at
        RETURNING us.state INTO user_state;
    ELSE
        SELECT us.state INTO user_state FROM adk_user_states us WHERE us.app_name = p_app_name AND us.user_id = p_user_id;
    END IF;
    IF p_app_delta <> '{}'::jsonb THEN
        INSERT INTO adk_app_states AS aps (app_name, state)
        VALUES (p_app_name, p_app_delta)
        ON CONFLICT (app_name) DO UPDATE SET state = aps.state || EXCLUDED.state, updated_at = EXCLUDED.updated_at
        RETURNING aps.state INTO app_state;
    ELSE
        SELECT aps.state INTO app_state FROM adk_app_states aps WHERE aps.app_name = p_app_name;
    END IF;
    RETURN NEXT;
END;
$$;

-- CREATE OR REPLACE resets a function's SET clauses: pin the path again,
-- and say again that PUBLIC may not execute it.
DO $$
BEGIN
    EXECUTE pg_catalog.format(
        'ALTER FUNCTION adk_create_session(text, text, text, text, jsonb, interval, jsonb, jsonb, text, jsonb) '
        'SET search_path = pg_catalog, %I, pg_temp', pg_catalog.current_schema());
END;
$$;
REVOKE EXECUTE ON FUNCTION adk_create_session(text, text, text, text, jsonb, interval, jsonb, jsonb, text, jsonb) FROM PUBLIC;
