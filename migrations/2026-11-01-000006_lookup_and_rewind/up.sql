-- Looking a session up by its id alone (adk's append_event takes only the
-- id), and rewinding a session to an earlier event, atomically.

-- session_id never changes after insert, so this index keeps appends HOT.
CREATE INDEX adk_sessions_session_id ON adk_sessions (session_id);

-- The live sessions with this id, at most p_limit of them: more than one
-- means the id alone is ambiguous.
CREATE FUNCTION adk_find_sessions(p_tenant text, p_session_id text, p_limit integer)
RETURNS TABLE (app_name text, user_id text)
LANGUAGE plpgsql
AS $$
#variable_conflict use_column
BEGIN
    PERFORM adk_enter_tenant(p_tenant);
    RETURN QUERY
    SELECT s.app_name, s.user_id FROM adk_sessions s
    WHERE s.session_id = p_session_id AND (s.expires_at IS NULL OR s.expires_at > now())
    ORDER BY s.app_name, s.user_id
    LIMIT p_limit;
END;
$$;

-- Keeps the first p_keep events of a session and forgets the rest: deletes
-- the later events (from the session's one partition), rebuilds the
-- session-scoped state from the kept events' deltas in order, and sets the
-- version back. App and user state are shared with other sessions and stay.
--
-- Outcomes: rewound, not_found, stale (p_expected_seq differs from
-- last_seq, returned in `seq`), beyond (p_keep is past the last event).
CREATE FUNCTION adk_rewind_session(
    p_tenant       text,
    p_app_name     text,
    p_user_id      text,
    p_session_id   text,
    p_keep         bigint,
    p_expected_seq bigint
) RETURNS TABLE (outcome text, seq bigint)
LANGUAGE plpgsql
SET plan_cache_mode = force_custom_plan
AS $$
#variable_conflict use_column
DECLARE
    s      record;
    folded jsonb;
BEGIN
    PERFORM adk_enter_tenant(p_tenant);
    SELECT a.last_seq, a.session_day, a.expires_at INTO s
      FROM adk_sessions a
     WHERE a.app_name = p_app_name AND a.user_id = p_user_id AND a.session_id = p_session_id
       FOR NO KEY UPDATE;
    IF NOT FOUND OR (s.expires_at IS NOT NULL AND s.expires_at <= now()) THEN
        RETURN QUERY SELECT 'not_found'::text, NULL::bigint;
        RETURN;
    END IF;
    IF p_expected_seq IS NOT NULL AND p_expected_seq <> s.last_seq THEN
        RETURN QUERY SELECT 'stale'::text, s.last_seq;
        RETURN;
    END IF;
    IF p_keep < 0 OR p_keep > s.last_seq THEN
        RETURN QUERY SELECT 'beyond'::text, s.last_seq;
        RETURN;
    END IF;

    DELETE FROM adk_events e
     WHERE e.app_name = p_app_name AND e.user_id = p_user_id AND e.session_id = p_session_id
       AND e.session_day = s.session_day AND e.seq > p_keep;

    -- jsonb keeps the last value of a repeated key, so aggregating in seq
    -- order replays the deltas.
    SELECT coalesce(jsonb_object_agg(d.key, d.value ORDER BY e.seq), '{}'::jsonb) INTO folded
      FROM adk_events e
     CROSS JOIN LATERAL jsonb_each(coalesce(e.payload -> 'actions' -> 'state_delta', '{}'::jsonb)) d
     WHERE e.app_name = p_app_name AND e.user_id = p_user_id AND e.session_id = p_session_id
       AND e.session_day = s.session_day AND e.seq <= p_keep
       AND d.key NOT LIKE 'app:%' AND d.key NOT LIKE 'user:%' AND d.key NOT LIKE 'temp:%';

    UPDATE adk_sessions a
       SET last_seq = p_keep, state = folded, updated_at = greatest(now(), a.updated_at)
     WHERE a.app_name = p_app_name AND a.user_id = p_user_id AND a.session_id = p_session_id;
    RETURN QUERY SELECT 'rewound'::text, p_keep;
END;
$$;
