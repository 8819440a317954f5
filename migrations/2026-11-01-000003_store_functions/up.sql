-- Every store operation is one call of one of these functions, so each
-- costs one round trip and runs as one transaction. They all take the
-- tenant first: when it is not NULL the function sets `adk.app_name` for its
-- own transaction only (set_config(…, true)), which row-level security reads.
-- The setting ends with the statement, so it can never leak to the next user
-- of a pooled connection, and the tenant-scoped mode costs no extra round
-- trip. All functions are SECURITY INVOKER: row-level security applies to
-- the role that calls them.
--
-- Plans are made for each call's own arguments (force_custom_plan) wherever
-- adk_events is read: a generic plan cached while today's partition was
-- nearly empty would keep scanning it sequentially as it fills, and on
-- PostgreSQL 15 a generic plan locks every partition before pruning.

CREATE FUNCTION adk_enter_tenant(p_tenant text) RETURNS void
    LANGUAGE plpgsql
AS $$
BEGIN
    IF p_tenant IS NOT NULL THEN
        PERFORM set_config('adk.app_name', p_tenant, true);
    END IF;
END;
$$;

-- Creates a session unless its key is taken (then no row), and upserts the
-- initial app and user state under their row locks. Returns the live app and
-- user state so the caller can merge without another read.
CREATE FUNCTION adk_create_session(
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

-- The session row with the live app and user state; no row when missing or
-- expired.
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
AS $$
#variable_conflict use_column
BEGIN
    PERFORM adk_enter_tenant(p_tenant);
    RETURN QUERY
    SELECT s.state, s.last_seq, s.session_day, s.created_at, s.updated_at, s.expires_at, s.closed_at,
           s.successor_id,
           (SELECT us.state FROM adk_user_states us WHERE us.app_name = s.app_name AND us.user_id = s.user_id),
           (SELECT aps.state FROM adk_app_states aps WHERE aps.app_name = s.app_name)
    FROM adk_sessions s
    WHERE s.app_name = p_app_name AND s.user_id = p_user_id AND s.session_id = p_session_id
      AND (s.expires_at IS NULL OR s.expires_at > now());
END;
$$;

-- A session's events in seq order. `p_session_day` is bound so exactly one
-- partition is read; `p_max_seq` pins the events to the version the session
-- read saw, so state and events describe the same moment. Newest first
-- inside, so LIMIT keeps the most recent, then back in order.
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
AS $$
#variable_conflict use_column
BEGIN
    PERFORM adk_enter_tenant(p_tenant);
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

-- One page of a user's sessions, newest first, after the keyset position
-- (p_after_time, p_after_id) when given. Metadata only, never events.
CREATE FUNCTION adk_list_sessions(
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
AS $$
#variable_conflict use_column
BEGIN
    PERFORM adk_enter_tenant(p_tenant);
    RETURN QUERY
    SELECT s.session_id, s.state, s.last_seq, s.created_at, s.updated_at, s.expires_at,
           us.state, aps.state
    FROM adk_sessions s
    LEFT JOIN adk_user_states us ON us.app_name = s.app_name AND us.user_id = s.user_id
    LEFT JOIN adk_app_states aps ON aps.app_name = s.app_name
    WHERE s.app_name = p_app_name AND s.user_id = p_user_id
      AND (s.expires_at IS NULL OR s.expires_at > now())
      AND (p_after_time IS NULL OR (s.updated_at, s.session_id) < (p_after_time, p_after_id))
    ORDER BY s.updated_at DESC, s.session_id DESC
    LIMIT p_limit;
END;
$$;

-- Deletes a session; its events go by the cascade, which carries
-- session_day and so touches one partition. Returns the rows deleted (0 or 1).
CREATE FUNCTION adk_delete_session(p_tenant text, p_app_name text, p_user_id text, p_session_id text)
RETURNS bigint
LANGUAGE plpgsql
SET plan_cache_mode = force_custom_plan
AS $$
DECLARE
    deleted bigint;
BEGIN
    PERFORM adk_enter_tenant(p_tenant);
    DELETE FROM adk_sessions s
    WHERE s.app_name = p_app_name AND s.user_id = p_user_id AND s.session_id = p_session_id;
    GET DIAGNOSTICS deleted = ROW_COUNT;
    RETURN deleted;
END;
$$;

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
