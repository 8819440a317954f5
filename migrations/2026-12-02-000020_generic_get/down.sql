SET LOCAL lock_timeout = '5s';

-- The get as migration 19 left it: its event read through EXECUTE.

CREATE OR REPLACE FUNCTION adk_get_session(p_tenant text, p_app_name text, p_user_id text, p_session_id text, p_after_ts bigint, p_limit bigint)
 RETURNS TABLE(state jsonb, last_seq bigint, session_day date, created_at timestamp with time zone, updated_at timestamp with time zone, expires_at timestamp with time zone, closed_at timestamp with time zone, successor_id text, display_name text, labels jsonb, user_state jsonb, app_state jsonb, payload jsonb)
 LANGUAGE plpgsql
 STABLE SECURITY DEFINER
AS $$
#variable_conflict use_column
DECLARE
    s record;
BEGIN
    IF NOT adk_tenant_allows(p_tenant, p_app_name) THEN
        RETURN;
    END IF;
    SELECT a.state, a.last_seq, a.session_day, a.created_at, a.updated_at, a.expires_at, a.closed_at,
           a.successor_id, a.display_name, a.labels,
           -- By the arguments, not correlated with the session row: Citus
           -- routes no statement with a correlated subquery to one shard.
           (SELECT us.state FROM adk_user_states us WHERE us.app_name = p_app_name AND us.user_id = p_user_id)
               AS user_state,
           (SELECT aps.state FROM adk_app_states aps WHERE aps.app_name = p_app_name) AS app_state
      INTO s
      FROM adk_sessions a
     WHERE a.app_name = p_app_name AND a.user_id = p_user_id AND a.session_id = p_session_id
       AND (a.expires_at IS NULL OR a.expires_at > pg_catalog.now());
    IF NOT FOUND THEN
        RETURN;
    END IF;
    RETURN QUERY SELECT s.state, s.last_seq, s.session_day, s.created_at, s.updated_at, s.expires_at,
                        s.closed_at, s.successor_id, s.display_name, s.labels, s.user_state, s.app_state,
                        NULL::jsonb;
    IF s.last_seq = 0 OR p_limit = 0 THEN
        RETURN;
    END IF;
    -- The one read of a partition, planned with its arguments on every call
    -- (EXECUTE): a cached generic plan made while the day's partition was
    -- small would go on scanning it sequentially once it filled. The session
    -- read above is by primary key and keeps its cached plan.
    RETURN QUERY EXECUTE
        'SELECT NULL::jsonb, NULL::bigint, NULL::date, NULL::timestamptz, NULL::timestamptz,
                NULL::timestamptz, NULL::timestamptz, NULL::text, NULL::text, NULL::jsonb, NULL::jsonb,
                NULL::jsonb, recent.payload
           FROM (SELECT e.seq, e.payload FROM adk_events e
                  WHERE e.app_name = $1 AND e.user_id = $2 AND e.session_id = $3 AND e.session_day = $4
                    AND e.seq <= $5 AND ($6::bigint IS NULL OR e.event_ts >= $6)
                  ORDER BY e.seq DESC
                  LIMIT $7) recent
          ORDER BY recent.seq'
        USING p_app_name, p_user_id, p_session_id, s.session_day, s.last_seq, p_after_ts, p_limit;
END;
$$;

-- CREATE OR REPLACE resets a function's SET clauses: pin the path again,
-- and say again that PUBLIC may not execute it.
DO $$
BEGIN
    EXECUTE pg_catalog.format(
        'ALTER FUNCTION adk_get_session(text, text, text, text, bigint, bigint) '
        'SET search_path = pg_catalog, %I, pg_temp', pg_catalog.current_schema());
END;
$$;
REVOKE EXECUTE ON FUNCTION adk_get_session(text, text, text, text, bigint, bigint) FROM PUBLIC;
