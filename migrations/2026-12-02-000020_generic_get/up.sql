SET LOCAL lock_timeout = '5s';

-- The get's event read on a kept plan instead of through EXECUTE.
--
-- EXECUTE parsed and planned the read on every call, which cost the get a
-- third of its time (pgbench on one server, 20 recent of 40 events: 0.31-0.47
-- ms a call against 0.20-0.26 ms on a kept plan), and more with more
-- partitions, since every plan of it looked at each partition's bounds. It
-- was there because a plan kept while today's partition was small would go
-- on scanning it sequentially once it filled. A generic plan made with
-- sequential scans off cannot: it reads the partition through its index
-- whatever the statistics said, and it prunes the other partitions as it
-- starts, so one plan serves every day. tests/tests/plan_cache.rs pins both.

CREATE OR REPLACE FUNCTION adk_get_session(p_tenant text, p_app_name text, p_user_id text, p_session_id text, p_after_ts bigint, p_limit bigint)
 RETURNS TABLE(state jsonb, last_seq bigint, session_day date, created_at timestamp with time zone, updated_at timestamp with time zone, expires_at timestamp with time zone, closed_at timestamp with time zone, successor_id text, display_name text, labels jsonb, user_state jsonb, app_state jsonb, payload jsonb)
 LANGUAGE plpgsql
 STABLE SECURITY DEFINER
 SET plan_cache_mode = force_generic_plan
 SET enable_seqscan = off
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
    -- A static statement, so its plan is kept: generic (the function's
    -- plan_cache_mode), so it is never planned again and prunes to the
    -- session's partition as it starts, whatever the number of partitions;
    -- and made with sequential scans off, so a plan made while the day's
    -- partition was small reads it by index once it has filled.
    RETURN QUERY
    SELECT NULL::jsonb, NULL::bigint, NULL::date, NULL::timestamptz, NULL::timestamptz, NULL::timestamptz,
           NULL::timestamptz, NULL::text, NULL::text, NULL::jsonb, NULL::jsonb, NULL::jsonb, recent.payload
      FROM (SELECT e.seq, e.payload FROM adk_events e
             WHERE e.app_name = p_app_name AND e.user_id = p_user_id AND e.session_id = p_session_id
               AND e.session_day = s.session_day AND e.seq <= s.last_seq
               AND (p_after_ts IS NULL OR e.event_ts >= p_after_ts)
             ORDER BY e.seq DESC
             LIMIT p_limit) recent
     ORDER BY recent.seq;
END;
$$;

-- CREATE OR REPLACE resets a function's SET clauses: pin the path again
-- (beside the two above), and say again that PUBLIC may not execute it.
DO $$
BEGIN
    EXECUTE pg_catalog.format(
        'ALTER FUNCTION adk_get_session(text, text, text, text, bigint, bigint) '
        'SET search_path = pg_catalog, %I, pg_temp', pg_catalog.current_schema());
END;
$$;
REVOKE EXECUTE ON FUNCTION adk_get_session(text, text, text, text, bigint, bigint) FROM PUBLIC;
