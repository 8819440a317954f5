-- Back to a get in two calls: migration 8's adk_load_session and
-- adk_load_events, pinned, not PUBLIC, and granted to the bound roles.

CREATE FUNCTION adk_load_session(p_tenant text, p_app_name text, p_user_id text, p_session_id text)
RETURNS TABLE (
    state        jsonb,
    last_seq     bigint,
    session_day  date,
    created_at   timestamptz,
    updated_at   timestamptz,
    expires_at   timestamptz,
    closed_at    timestamptz,
    successor_id text,
    user_state   jsonb,
    app_state    jsonb
)
LANGUAGE plpgsql
SECURITY DEFINER
AS $$
#variable_conflict use_column
BEGIN
    IF NOT adk_tenant_allows(p_tenant, p_app_name) THEN
        RETURN;
    END IF;
    RETURN QUERY
    SELECT s.state, s.last_seq, s.session_day, s.created_at, s.updated_at, s.expires_at, s.closed_at,
           s.successor_id,
           (SELECT us.state FROM adk_user_states us WHERE us.app_name = s.app_name AND us.user_id = s.user_id),
           (SELECT aps.state FROM adk_app_states aps WHERE aps.app_name = s.app_name)
    FROM adk_sessions s
    WHERE s.app_name = p_app_name AND s.user_id = p_user_id AND s.session_id = p_session_id
      AND (s.expires_at IS NULL OR s.expires_at > pg_catalog.now());
END;
$$;

CREATE FUNCTION adk_load_events(
    p_tenant      text,
    p_app_name    text,
    p_user_id     text,
    p_session_id  text,
    p_session_day date,
    p_max_seq     bigint,
    p_after_ts    bigint,
    p_limit       bigint
) RETURNS TABLE (payload jsonb)
LANGUAGE plpgsql
SET plan_cache_mode = force_custom_plan
SECURITY DEFINER
AS $$
#variable_conflict use_column
BEGIN
    IF NOT adk_tenant_allows(p_tenant, p_app_name) THEN
        RETURN;
    END IF;
    RETURN QUERY
    SELECT recent.payload FROM (
        SELECT e.seq, e.payload FROM adk_events e
        WHERE e.app_name = p_app_name AND e.user_id = p_user_id AND e.session_id = p_session_id
          AND e.session_day = p_session_day
          AND e.seq <= p_max_seq AND (p_after_ts IS NULL OR e.event_ts >= p_after_ts)
        ORDER BY e.seq DESC
        LIMIT p_limit
    ) recent ORDER BY recent.seq;
END;
$$;

DO $$
DECLARE
    r regrole;
BEGIN
    EXECUTE pg_catalog.format(
        'ALTER FUNCTION adk_load_session(text, text, text, text) SET search_path = pg_catalog, %I, pg_temp',
        pg_catalog.current_schema());
    EXECUTE pg_catalog.format(
        'ALTER FUNCTION adk_load_events(text, text, text, text, date, bigint, bigint, bigint) '
        'SET search_path = pg_catalog, %I, pg_temp', pg_catalog.current_schema());
    REVOKE EXECUTE ON FUNCTION adk_load_session(text, text, text, text) FROM PUBLIC;
    REVOKE EXECUTE ON FUNCTION adk_load_events(text, text, text, text, date, bigint, bigint, bigint) FROM PUBLIC;
    FOR r IN SELECT DISTINCT b.role_oid::regrole FROM adk_role_apps b
              WHERE EXISTS (SELECT FROM pg_catalog.pg_roles x WHERE x.oid = b.role_oid) LOOP
        EXECUTE pg_catalog.format('GRANT EXECUTE ON FUNCTION adk_load_session(text, text, text, text) TO %s', r);
        EXECUTE pg_catalog.format(
            'GRANT EXECUTE ON FUNCTION adk_load_events(text, text, text, text, date, bigint, bigint, bigint) TO %s', r);
    END LOOP;
END;
$$;

DROP FUNCTION adk_get_session(text, text, text, text, bigint, bigint);
