-- Back to the functions of migrations 3, 4 and 6, without the policy.

DROP FUNCTION adk_append_event(text, text, text, text, text, text, text, bigint, jsonb, jsonb, jsonb, jsonb, bigint,
                               interval);
CREATE FUNCTION adk_append_event(
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
    successor_id text
)
LANGUAGE plpgsql
SET plan_cache_mode = force_custom_plan
AS $$
#variable_conflict use_column
DECLARE
    s          record;
    prior      record;
    next_seq   bigint;
    new_update timestamptz;
BEGIN
    PERFORM adk_enter_tenant(p_tenant);
    SELECT a.last_seq, a.session_day, a.created_at, a.updated_at, a.expires_at,
           a.closed_at, a.successor_id
      INTO s
      FROM adk_sessions a
     WHERE a.app_name = p_app_name AND a.user_id = p_user_id AND a.session_id = p_session_id
       FOR NO KEY UPDATE;

    IF NOT FOUND OR (s.expires_at IS NOT NULL AND s.expires_at <= now()) THEN
        RETURN QUERY SELECT 'not_found'::text, NULL::bigint, NULL::date, NULL::timestamptz,
                            NULL::jsonb, NULL::text;
        RETURN;
    END IF;

    -- A retry of an append that already succeeded: answer with what is stored.
    SELECT e.seq, e.payload INTO prior
      FROM adk_events e
     WHERE e.app_name = p_app_name AND e.user_id = p_user_id AND e.session_id = p_session_id
       AND e.session_day = s.session_day AND e.event_id = p_event_id;
    IF FOUND THEN
        RETURN QUERY SELECT CASE WHEN prior.payload = p_payload THEN 'replayed' ELSE 'duplicate' END,
                            prior.seq, s.session_day, s.updated_at, prior.payload, NULL::text;
        RETURN;
    END IF;

    IF s.closed_at IS NOT NULL THEN
        RETURN QUERY SELECT 'closed'::text, s.last_seq, s.session_day, s.updated_at, NULL::jsonb,
                            s.successor_id;
        RETURN;
    END IF;
    IF p_max_lifetime IS NOT NULL AND s.created_at + p_max_lifetime <= now() THEN
        RETURN QUERY SELECT 'too_old'::text, s.last_seq, s.session_day, s.updated_at, NULL::jsonb,
                            NULL::text;
        RETURN;
    END IF;
    IF p_expected_seq IS NOT NULL AND p_expected_seq <> s.last_seq THEN
        RETURN QUERY SELECT 'stale'::text, s.last_seq, s.session_day, s.updated_at, NULL::jsonb,
                            NULL::text;
        RETURN;
    END IF;

    next_seq := s.last_seq + 1;
    -- now() is the transaction start; a writer that waited for the lock may
    -- have started before the one it waited for, so never step backwards.
    new_update := greatest(now(), s.updated_at);

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
        DO UPDATE SET state = u.state || EXCLUDED.state, updated_at = now();
    END IF;
    IF p_app_delta IS NOT NULL AND p_app_delta <> '{}'::jsonb THEN
        INSERT INTO adk_app_states AS a (app_name, state)
        VALUES (p_app_name, p_app_delta)
        ON CONFLICT (app_name)
        DO UPDATE SET state = a.state || EXCLUDED.state, updated_at = now();
    END IF;

    RETURN QUERY SELECT 'stored'::text, next_seq, s.session_day, new_update, p_payload, NULL::text;
END;
$$;

CREATE OR REPLACE FUNCTION adk_create_session(
    p_tenant     text,
    p_app_name   text,
    p_user_id    text,
    p_session_id text,
    p_state      jsonb,
    p_ttl        interval,
    p_user_delta jsonb,
    p_app_delta  jsonb
) RETURNS TABLE (
    created_at timestamptz,
    updated_at timestamptz,
    expires_at timestamptz,
    user_state jsonb,
    app_state  jsonb
)
LANGUAGE plpgsql
AS $$
#variable_conflict use_column
DECLARE
    born  record;
    u     jsonb;
    a     jsonb;
BEGIN
    PERFORM adk_enter_tenant(p_tenant);
    INSERT INTO adk_sessions (app_name, user_id, session_id, state, expires_at)
    VALUES (p_app_name, p_user_id, p_session_id, p_state, now() + p_ttl)
    ON CONFLICT DO NOTHING
    RETURNING adk_sessions.created_at, adk_sessions.updated_at, adk_sessions.expires_at INTO born;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    IF p_user_delta <> '{}'::jsonb THEN
        INSERT INTO adk_user_states AS us (app_name, user_id, state)
        VALUES (p_app_name, p_user_id, p_user_delta)
        ON CONFLICT (app_name, user_id) DO UPDATE SET state = us.state || EXCLUDED.state, updated_at = now()
        RETURNING us.state INTO u;
    ELSE
        SELECT us.state INTO u FROM adk_user_states us WHERE us.app_name = p_app_name AND us.user_id = p_user_id;
    END IF;
    IF p_app_delta <> '{}'::jsonb THEN
        INSERT INTO adk_app_states AS aps (app_name, state)
        VALUES (p_app_name, p_app_delta)
        ON CONFLICT (app_name) DO UPDATE SET state = aps.state || EXCLUDED.state, updated_at = now()
        RETURNING aps.state INTO a;
    ELSE
        SELECT aps.state INTO a FROM adk_app_states aps WHERE aps.app_name = p_app_name;
    END IF;
    RETURN QUERY SELECT born.created_at, born.updated_at, born.expires_at, u, a;
END;
$$;

CREATE OR REPLACE FUNCTION adk_rollover_session(
    p_tenant        text,
    p_app_name      text,
    p_user_id       text,
    p_session_id    text,
    p_successor_id  text,
    p_event_id      text,
    p_invocation_id text,
    p_author        text,
    p_event_ts      bigint,
    p_payload       jsonb,
    p_ttl           interval
) RETURNS TABLE (
    outcome      text,
    state        jsonb,
    created_at   timestamptz,
    updated_at   timestamptz,
    expires_at   timestamptz,
    successor_id text
)
LANGUAGE plpgsql
SET plan_cache_mode = force_custom_plan
AS $$
#variable_conflict use_column
DECLARE
    old  record;
    born record;
BEGIN
    PERFORM adk_enter_tenant(p_tenant);
    SELECT a.state, a.expires_at, a.closed_at, a.successor_id
      INTO old
      FROM adk_sessions a
     WHERE a.app_name = p_app_name AND a.user_id = p_user_id AND a.session_id = p_session_id
       FOR NO KEY UPDATE;
    IF NOT FOUND OR (old.expires_at IS NOT NULL AND old.expires_at <= now()) THEN
        RETURN QUERY SELECT 'not_found'::text, NULL::jsonb, NULL::timestamptz, NULL::timestamptz,
                            NULL::timestamptz, NULL::text;
        RETURN;
    END IF;
    IF old.closed_at IS NOT NULL THEN
        RETURN QUERY SELECT 'closed'::text, NULL::jsonb, NULL::timestamptz, NULL::timestamptz,
                            NULL::timestamptz, old.successor_id;
        RETURN;
    END IF;

    INSERT INTO adk_sessions (app_name, user_id, session_id, state, last_seq, expires_at)
    VALUES (p_app_name, p_user_id, p_successor_id, old.state, 1, now() + p_ttl)
    ON CONFLICT DO NOTHING
    RETURNING adk_sessions.session_day, adk_sessions.created_at, adk_sessions.updated_at,
              adk_sessions.expires_at
    INTO born;
    IF NOT FOUND THEN
        RETURN QUERY SELECT 'exists'::text, NULL::jsonb, NULL::timestamptz, NULL::timestamptz,
                            NULL::timestamptz, NULL::text;
        RETURN;
    END IF;

    INSERT INTO adk_events (app_name, user_id, session_id, session_day, seq, event_id,
                            invocation_id, author, event_ts, payload)
    VALUES (p_app_name, p_user_id, p_successor_id, born.session_day, 1, p_event_id,
            p_invocation_id, p_author, p_event_ts, p_payload);

    UPDATE adk_sessions a
       SET closed_at = now(), successor_id = p_successor_id, updated_at = greatest(now(), a.updated_at)
     WHERE a.app_name = p_app_name AND a.user_id = p_user_id AND a.session_id = p_session_id;

    RETURN QUERY SELECT 'rolled'::text, old.state, born.created_at, born.updated_at, born.expires_at,
                        p_successor_id;
END;
$$;

CREATE OR REPLACE FUNCTION adk_rewind_session(
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

DROP FUNCTION adk_premake_event_partitions();

ALTER TABLE adk_sessions
    DROP CONSTRAINT adk_sessions_initial_state_size,
    DROP CONSTRAINT adk_sessions_initial_state_is_object,
    DROP COLUMN initial_state;

ALTER TABLE adk_maintenance_runs
    DROP CONSTRAINT adk_maintenance_runs_outcome_known,
    DROP COLUMN kept_days,
    DROP COLUMN error,
    DROP COLUMN outcome;

DROP FUNCTION adk_policy_seconds(interval);
DROP TRIGGER adk_store_policy_guard ON adk_store_policy;
DROP FUNCTION adk_store_policy_guard();
DROP TABLE adk_store_policy_changes;
DROP TABLE adk_store_policy;
