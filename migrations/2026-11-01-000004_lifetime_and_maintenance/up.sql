-- Session lifetime and the record of maintenance runs.

-- One row per maintenance run; health reads the last successful one.
CREATE TABLE adk_maintenance_runs (
    run_id           bigint      GENERATED ALWAYS AS IDENTITY,
    started_at       timestamptz NOT NULL,
    finished_at      timestamptz NOT NULL DEFAULT now(),
    today            date        NOT NULL,
    created          integer     NOT NULL,
    dropped          integer     NOT NULL,
    finalized        integer     NOT NULL,
    sessions_deleted bigint      NOT NULL,
    partitions_ahead integer     NOT NULL,
    CONSTRAINT adk_maintenance_runs_pkey PRIMARY KEY (run_id)
);

-- Closes a session and opens its successor in one statement: the successor
-- gets a new id, the closed session's session-scoped state, today's UTC
-- session day, and the caller's summary as its first event.
--
-- Outcomes: rolled (the successor's row is returned), not_found, closed
-- (already rolled over; successor_id names where it went), exists (the
-- successor id is taken). A missing partition for today raises PostgreSQL's
-- "no partition of relation" error and nothing is written.
CREATE FUNCTION adk_rollover_session(
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
