SET LOCAL lock_timeout = '5s';

-- The change feed's event read on a kept plan instead of through EXECUTE,
-- as migration 20 did for the get: EXECUTE parsed and planned the read on
-- every call, and every plan looked at each partition's bounds. A generic
-- plan made with sequential scans off reads the session's partition by its
-- index whatever the statistics said when it was made, and prunes the other
-- partitions as it starts. tests/tests/plan_cache.rs holds the feed to that
-- on a warm connection after the partition has filled. On Citus the
-- distribution step plans the read per call instead, as for the get.

CREATE OR REPLACE FUNCTION adk_read_events_after(p_tenant text, p_app_name text, p_user_id text, p_session_id text, p_after_seq bigint, p_limit integer)
 RETURNS TABLE(last_seq bigint, created_at timestamp with time zone, expires_at timestamp with time zone, closed_at timestamp with time zone, successor_id text, seq bigint, event_id text, payload jsonb)
 LANGUAGE plpgsql
 STABLE SECURITY DEFINER
 SET plan_cache_mode = force_generic_plan
 SET enable_seqscan = off
AS $$
#variable_conflict use_column
DECLARE
    s record;
BEGIN
    IF p_after_seq IS NULL OR p_after_seq < 0 THEN
        RAISE EXCEPTION 'p_after_seq must be 0 or more, not %', coalesce(p_after_seq::text, 'NULL')
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF p_limit IS NULL OR p_limit < 1 THEN
        RAISE EXCEPTION 'p_limit must be 1 or more, not %', coalesce(p_limit::text, 'NULL')
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF NOT adk_tenant_allows(p_tenant, p_app_name) THEN
        RETURN;
    END IF;
    SELECT a.last_seq, a.session_day, a.created_at, a.expires_at, a.closed_at, a.successor_id
      INTO s
      FROM adk_sessions a
     WHERE a.app_name = p_app_name AND a.user_id = p_user_id AND a.session_id = p_session_id
       AND (a.expires_at IS NULL OR a.expires_at > pg_catalog.now());
    IF NOT FOUND THEN
        RETURN;
    END IF;
    RETURN QUERY SELECT s.last_seq, s.created_at, s.expires_at, s.closed_at, s.successor_id,
                        NULL::bigint, NULL::text, NULL::jsonb;
    IF s.last_seq = 0 OR s.last_seq < p_after_seq THEN
        RETURN;
    END IF;
    -- One generic plan, made once per connection with sequential scans off,
    -- as the get's (migration 20).
    RETURN QUERY
    SELECT NULL::bigint, NULL::timestamptz, NULL::timestamptz, NULL::timestamptz, NULL::text,
           e.seq, e.event_id, CASE WHEN e.seq > p_after_seq THEN e.payload END
      FROM adk_events e
     WHERE e.app_name = p_app_name AND e.user_id = p_user_id AND e.session_id = p_session_id
       AND e.session_day = s.session_day AND e.seq >= p_after_seq AND e.seq <= s.last_seq
     ORDER BY e.seq
     LIMIT p_limit::bigint + 1;
END;
$$;

-- CREATE OR REPLACE resets a function's SET clauses: pin the path again
-- (beside the two settings above), and say again that PUBLIC may not
-- execute it.
DO $$
BEGIN
    EXECUTE pg_catalog.format(
        'ALTER FUNCTION adk_read_events_after(text, text, text, text, bigint, integer) '
        'SET search_path = pg_catalog, %I, pg_temp', pg_catalog.current_schema());
END;
$$;
REVOKE EXECUTE ON FUNCTION adk_read_events_after(text, text, text, text, bigint, integer) FROM PUBLIC;
