-- Forking a conversation: a new session of the same app and user that
-- starts from the first N events of another. One function, so the copy is
-- one statement, atomic, and a service role needs no privilege on the
-- tables.

CREATE FUNCTION adk_fork_session(
    p_tenant     text,
    p_app_name   text,
    p_user_id    text,
    p_session_id text,
    p_new_id     text,
    p_at_seq     bigint,
    p_ttl        interval
) RETURNS TABLE (outcome text, seq bigint)
LANGUAGE plpgsql
SECURITY DEFINER
AS $$
#variable_conflict use_column
DECLARE
    s      record;
    born   record;
    ttl    interval;
    folded jsonb;
BEGIN
    IF NOT adk_tenant_allows(p_tenant, p_app_name) THEN
        PERFORM adk_tenant_require(p_tenant, p_app_name);
    END IF;
    -- FOR SHARE: a rewind (which deletes events under FOR NO KEY UPDATE)
    -- cannot run between reading last_seq and copying the events, so the
    -- fork holds exactly events 1..p_at_seq. Appends to the original wait
    -- for the copy; they would not change events 1..p_at_seq anyway.
    SELECT a.last_seq, a.session_day, a.expires_at, a.initial_state, a.display_name, a.labels INTO s
      FROM adk_sessions a
     WHERE a.app_name = p_app_name AND a.user_id = p_user_id AND a.session_id = p_session_id
       FOR SHARE;
    IF NOT FOUND OR (s.expires_at IS NOT NULL AND s.expires_at <= pg_catalog.now()) THEN
        RETURN QUERY SELECT 'not_found'::text, NULL::bigint;
        RETURN;
    END IF;
    IF p_at_seq < 0 OR p_at_seq > s.last_seq THEN
        RETURN QUERY SELECT 'beyond'::text, s.last_seq;
        RETURN;
    END IF;

    -- The id of an expired session that is not purged yet is free at once,
    -- as for create.
    DELETE FROM adk_sessions x
     WHERE x.app_name = p_app_name AND x.user_id = p_user_id AND x.session_id = p_new_id
       AND x.expires_at <= pg_catalog.now();

    -- Session state as rewind rebuilds it: the initial state, then the
    -- session-scoped deltas of the kept events in seq order (jsonb keeps
    -- the last value of a repeated key). App and user state are shared and
    -- already hold those events' deltas.
    SELECT coalesce(pg_catalog.jsonb_object_agg(d.key, d.value ORDER BY e.seq), '{}'::jsonb) INTO folded
      FROM adk_events e
     CROSS JOIN LATERAL pg_catalog.jsonb_each(coalesce(e.payload -> 'actions' -> 'state_delta', '{}'::jsonb)) d
     WHERE e.app_name = p_app_name AND e.user_id = p_user_id AND e.session_id = p_session_id
       AND e.session_day = s.session_day AND e.seq <= p_at_seq
       AND d.key NOT LIKE 'app:%' AND d.key NOT LIKE 'user:%' AND d.key NOT LIKE 'temp:%';

    SELECT least(adk_policy_seconds(p_ttl), adk_policy_seconds(p.default_ttl)) INTO ttl FROM adk_store_policy p;
    INSERT INTO adk_sessions (app_name, user_id, session_id, state, initial_state, last_seq, expires_at,
                              display_name, labels)
    VALUES (p_app_name, p_user_id, p_new_id, s.initial_state || folded, s.initial_state, p_at_seq,
            pg_catalog.now() + ttl, s.display_name, s.labels)
    ON CONFLICT DO NOTHING
    RETURNING adk_sessions.session_day INTO born;
    IF NOT FOUND THEN
        RETURN QUERY SELECT 'exists'::text, NULL::bigint;
        RETURN;
    END IF;

    -- The copies keep their original arrival time (created_at): they are
    -- not new model calls, and the usage rollup, which finds new events by
    -- arrival, has counted the originals once already.
    INSERT INTO adk_events (app_name, user_id, session_id, session_day, seq, event_id, invocation_id,
                            author, event_ts, created_at, payload)
    SELECT e.app_name, e.user_id, p_new_id, born.session_day, e.seq, e.event_id, e.invocation_id,
           e.author, e.event_ts, e.created_at, e.payload
      FROM adk_events e
     WHERE e.app_name = p_app_name AND e.user_id = p_user_id AND e.session_id = p_session_id
       AND e.session_day = s.session_day AND e.seq <= p_at_seq;

    RETURN QUERY SELECT 'forked'::text, p_at_seq;
END;
$$;

DO $$
BEGIN
    EXECUTE pg_catalog.format(
        'ALTER FUNCTION adk_fork_session(text, text, text, text, text, bigint, interval) '
        'SET search_path = pg_catalog, %I, pg_temp', pg_catalog.current_schema());
END;
$$;
REVOKE EXECUTE ON FUNCTION adk_fork_session(text, text, text, text, text, bigint, interval) FROM PUBLIC;

-- Roles already bound to apps may fork as they may rewind or roll over,
-- without re-running their setup.
DO $$
DECLARE
    r regrole;
BEGIN
    FOR r IN SELECT DISTINCT b.role_oid::regrole FROM adk_role_apps b
              WHERE EXISTS (SELECT FROM pg_catalog.pg_roles x WHERE x.oid = b.role_oid) LOOP
        EXECUTE pg_catalog.format(
            'GRANT EXECUTE ON FUNCTION adk_fork_session(text, text, text, text, text, bigint, interval) TO %s', r);
    END LOOP;
END;
$$;
