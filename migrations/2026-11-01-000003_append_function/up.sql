-- The append path in one statement, so an append costs one round trip: lock
-- the session row, replay an idempotent retry, check version, lifetime and
-- closure, take the next seq, insert the event, merge the session delta and
-- upsert the app/user deltas under their own row locks.
--
-- Outcomes (first column):
--   stored     the event was written with `seq`
--   replayed   an event with this id already exists with the same payload;
--              `seq` and `payload` are the stored ones, nothing was written
--   duplicate  an event with this id exists with a different payload
--   stale      `p_expected_seq` differs from the session's last_seq (`seq`)
--   not_found  no such session, or it has expired
--   closed     the session was closed by a rollover (`successor_id` set)
--   too_old    the session is older than `p_max_lifetime`
-- A missing partition for the session's day raises PostgreSQL's own
-- "no partition of relation" error; nothing is written.
CREATE FUNCTION adk_append_event(
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
AS $$
#variable_conflict use_column
DECLARE
    s          record;
    prior      record;
    next_seq   bigint;
    new_update timestamptz;
BEGIN
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
