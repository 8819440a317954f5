-- Back to migration 8's list: user and app state on every row.

CREATE OR REPLACE FUNCTION adk_list_sessions(
    p_tenant     text,
    p_app_name   text,
    p_user_id    text,
    p_after_time timestamptz,
    p_after_id   text,
    p_limit      bigint
) RETURNS TABLE (
    session_id text,
    state      jsonb,
    last_seq   bigint,
    created_at timestamptz,
    updated_at timestamptz,
    expires_at timestamptz,
    user_state jsonb,
    app_state  jsonb
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
    SELECT s.session_id, s.state, s.last_seq, s.created_at, s.updated_at, s.expires_at,
           us.state, aps.state
    FROM adk_sessions s
    LEFT JOIN adk_user_states us ON us.app_name = s.app_name AND us.user_id = s.user_id
    LEFT JOIN adk_app_states aps ON aps.app_name = s.app_name
    WHERE s.app_name = p_app_name AND s.user_id = p_user_id
      AND (s.expires_at IS NULL OR s.expires_at > pg_catalog.now())
      AND (p_after_time IS NULL OR (s.updated_at, s.session_id) < (p_after_time, p_after_id))
    ORDER BY s.updated_at DESC, s.session_id DESC
    LIMIT p_limit;
END;
$$;

-- CREATE OR REPLACE resets a function's SET clauses: pin the path again.
DO $$
BEGIN
    EXECUTE pg_catalog.format(
        'ALTER FUNCTION adk_list_sessions(text, text, text, timestamptz, text, bigint) '
        'SET search_path = pg_catalog, %I, pg_temp', pg_catalog.current_schema());
END;
$$;
