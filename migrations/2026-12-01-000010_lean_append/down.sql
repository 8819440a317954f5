-- Back to migrations 8 and 9: the append of migration 8, every statement
-- planned per call under plan_cache_mode = force_custom_plan.

CREATE OR REPLACE FUNCTION adk_append_event(
    p_tenant        text,
    p_app_name      text,
    p_user_id       text,
    p_session_id    text,
    p_event_id      text,
    p_invocation_id text,
    p_author        text,
    p_event_ts      bigint,
    p_payload       jsonb,
    p_session_delta jsonb,
    p_user_delta    jsonb,
    p_app_delta     jsonb,
    p_expected_seq  bigint,
    p_max_lifetime  interval
) RETURNS TABLE (
    outcome      text,
    seq          bigint,
    session_day  date,
    updated_at   timestamptz,
    payload      jsonb,
    successor_id text,
    max_lifetime interval
)
LANGUAGE plpgsql
SET plan_cache_mode = force_custom_plan
SECURITY DEFINER
AS $$
#variable_conflict use_column
DECLARE
    s          record;
    prior      record;
    lifetime   interval;
    next_seq   bigint;
    new_update timestamptz;
BEGIN
    IF NOT adk_tenant_allows(p_tenant, p_app_name) THEN
        PERFORM adk_tenant_require(p_tenant, p_app_name);
    END IF;
    SELECT a.last_seq, a.session_day, a.created_at, a.updated_at, a.expires_at,
           a.closed_at, a.successor_id
      INTO s
      FROM adk_sessions a
     WHERE a.app_name = p_app_name AND a.user_id = p_user_id AND a.session_id = p_session_id
       FOR NO KEY UPDATE;

    IF NOT FOUND OR (s.expires_at IS NOT NULL AND s.expires_at <= pg_catalog.now()) THEN
        RETURN QUERY SELECT 'not_found'::text, NULL::bigint, NULL::date, NULL::timestamptz,
                            NULL::jsonb, NULL::text, NULL::interval;
        RETURN;
    END IF;

    -- A retry of an append that already succeeded: answer with what is stored.
    SELECT e.seq, e.payload INTO prior
      FROM adk_events e
     WHERE e.app_name = p_app_name AND e.user_id = p_user_id AND e.session_id = p_session_id
       AND e.session_day = s.session_day AND e.event_id = p_event_id;
    IF FOUND THEN
        RETURN QUERY SELECT CASE WHEN prior.payload = p_payload THEN 'replayed' ELSE 'duplicate' END,
                            prior.seq, s.session_day, s.updated_at, prior.payload, NULL::text, NULL::interval;
        RETURN;
    END IF;

    IF s.closed_at IS NOT NULL THEN
        RETURN QUERY SELECT 'closed'::text, s.last_seq, s.session_day, s.updated_at, NULL::jsonb,
                            s.successor_id, NULL::interval;
        RETURN;
    END IF;
    SELECT least(adk_policy_seconds(p.max_session_lifetime), adk_policy_seconds(p_max_lifetime))
      INTO lifetime FROM adk_store_policy p;
    lifetime := coalesce(lifetime, adk_policy_seconds(p_max_lifetime));
    IF lifetime IS NOT NULL AND s.created_at + lifetime <= pg_catalog.now() THEN
        RETURN QUERY SELECT 'too_old'::text, s.last_seq, s.session_day, s.updated_at, NULL::jsonb,
                            NULL::text, lifetime;
        RETURN;
    END IF;
    IF p_expected_seq IS NOT NULL AND p_expected_seq <> s.last_seq THEN
        RETURN QUERY SELECT 'stale'::text, s.last_seq, s.session_day, s.updated_at, NULL::jsonb,
                            NULL::text, NULL::interval;
        RETURN;
    END IF;

    next_seq := s.last_seq + 1;
    -- now() is the transaction start; a writer that waited for the lock may
    -- have started before the one it waited for, so never step backwards.
    new_update := greatest(pg_catalog.now(), s.updated_at);

    INSERT INTO adk_events (app_name, user_id, session_id, session_day, seq, event_id,
                            invocation_id, author, event_ts, payload)
    VALUES (p_app_name, p_user_id, p_session_id, s.session_day, next_seq, p_event_id,
            p_invocation_id, p_author, p_event_ts, p_payload);

    -- Rewriting jsonb costs O(state size) and its WAL; touch state only when
    -- the delta has keys.
    IF p_session_delta IS NOT NULL AND p_session_delta <> '{}'::jsonb THEN
        UPDATE adk_sessions a
           SET last_seq = next_seq, updated_at = new_update, state = a.state || p_session_delta
         WHERE a.app_name = p_app_name AND a.user_id = p_user_id AND a.session_id = p_session_id;
    ELSE
        UPDATE adk_sessions a
           SET last_seq = next_seq, updated_at = new_update
         WHERE a.app_name = p_app_name AND a.user_id = p_user_id AND a.session_id = p_session_id;
    END IF;

    IF p_user_delta IS NOT NULL AND p_user_delta <> '{}'::jsonb THEN
        INSERT INTO adk_user_states AS u (app_name, user_id, state)
        VALUES (p_app_name, p_user_id, p_user_delta)
        ON CONFLICT (app_name, user_id)
        DO UPDATE SET state = u.state || EXCLUDED.state, updated_at = pg_catalog.now();
    END IF;
    IF p_app_delta IS NOT NULL AND p_app_delta <> '{}'::jsonb THEN
        INSERT INTO adk_app_states AS a (app_name, state)
        VALUES (p_app_name, p_app_delta)
        ON CONFLICT (app_name)
        DO UPDATE SET state = a.state || EXCLUDED.state, updated_at = pg_catalog.now();
    END IF;

    RETURN QUERY SELECT 'stored'::text, next_seq, s.session_day, new_update, NULL::jsonb, NULL::text,
                        NULL::interval;
END;
$$;

-- CREATE OR REPLACE resets a function's SET clauses: pin the path again.
DO $$
BEGIN
    EXECUTE pg_catalog.format(
        'ALTER FUNCTION adk_append_event(text, text, text, text, text, text, text, bigint, jsonb, jsonb, jsonb, '
        'jsonb, bigint, interval) SET search_path = pg_catalog, %I, pg_temp', pg_catalog.current_schema());
END;
$$;
REVOKE EXECUTE ON FUNCTION adk_append_event(text, text, text, text, text, text, text, bigint, jsonb, jsonb,
    jsonb, jsonb, bigint, interval) FROM PUBLIC;
