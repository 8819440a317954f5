-- Back to migration 13's store: no display name, no labels, list without
-- filters. The functions get the bodies they had before (create and
-- rollover from migration 8, list from migration 9, get from migration 11),
-- pinned, not PUBLIC, and granted again to the roles bound to apps.

SET LOCAL lock_timeout = '5s';

DROP FUNCTION adk_set_session_metadata(text, text, text, text, text, jsonb);

DROP FUNCTION adk_create_session(text, text, text, text, jsonb, interval, jsonb, jsonb, text, jsonb);
DROP FUNCTION adk_get_session(text, text, text, text, bigint, bigint);
DROP FUNCTION adk_list_sessions(text, text, text, timestamptz, text, bigint, jsonb, timestamptz, timestamptz);

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
SECURITY DEFINER
AS $$
#variable_conflict use_column
DECLARE
    born  record;
    ttl   interval;
    u     jsonb;
    a     jsonb;
BEGIN
    IF NOT adk_tenant_allows(p_tenant, p_app_name) THEN
        PERFORM adk_tenant_require(p_tenant, p_app_name);
    END IF;
    DELETE FROM adk_sessions x
     WHERE x.app_name = p_app_name AND x.user_id = p_user_id AND x.session_id = p_session_id
       AND x.expires_at <= pg_catalog.now();
    SELECT least(adk_policy_seconds(p_ttl), adk_policy_seconds(p.default_ttl)) INTO ttl FROM adk_store_policy p;
    INSERT INTO adk_sessions (app_name, user_id, session_id, state, initial_state, expires_at)
    VALUES (p_app_name, p_user_id, p_session_id, p_state, p_state, pg_catalog.now() + ttl)
    ON CONFLICT DO NOTHING
    RETURNING adk_sessions.created_at, adk_sessions.updated_at, adk_sessions.expires_at INTO born;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    IF p_user_delta <> '{}'::jsonb THEN
        INSERT INTO adk_user_states AS us (app_name, user_id, state)
        VALUES (p_app_name, p_user_id, p_user_delta)
        ON CONFLICT (app_name, user_id) DO UPDATE SET state = us.state || EXCLUDED.state, updated_at = pg_catalog.now()
        RETURNING us.state INTO u;
    ELSE
        SELECT us.state INTO u FROM adk_user_states us WHERE us.app_name = p_app_name AND us.user_id = p_user_id;
    END IF;
    IF p_app_delta <> '{}'::jsonb THEN
        INSERT INTO adk_app_states AS aps (app_name, state)
        VALUES (p_app_name, p_app_delta)
        ON CONFLICT (app_name) DO UPDATE SET state = aps.state || EXCLUDED.state, updated_at = pg_catalog.now()
        RETURNING aps.state INTO a;
    ELSE
        SELECT aps.state INTO a FROM adk_app_states aps WHERE aps.app_name = p_app_name;
    END IF;
    RETURN QUERY SELECT born.created_at, born.updated_at, born.expires_at, u, a;
END;
$$;

CREATE FUNCTION adk_get_session(
    p_tenant     text,
    p_app_name   text,
    p_user_id    text,
    p_session_id text,
    p_after_ts   bigint,
    p_limit      bigint
) RETURNS TABLE (
    state        jsonb,
    last_seq     bigint,
    session_day  date,
    created_at   timestamptz,
    updated_at   timestamptz,
    expires_at   timestamptz,
    closed_at    timestamptz,
    successor_id text,
    user_state   jsonb,
    app_state    jsonb,
    payload      jsonb
)
LANGUAGE plpgsql
-- STABLE: both reads see one snapshot, so the events are exactly those of
-- the version the session row reports.
STABLE
SECURITY DEFINER
AS $$
#variable_conflict use_column
DECLARE
    s record;
BEGIN
    IF NOT adk_tenant_allows(p_tenant, p_app_name) THEN
        RETURN;
    END IF;
    SELECT a.state, a.last_seq, a.session_day, a.created_at, a.updated_at, a.expires_at, a.closed_at,
           a.successor_id,
           (SELECT us.state FROM adk_user_states us WHERE us.app_name = a.app_name AND us.user_id = a.user_id)
               AS user_state,
           (SELECT aps.state FROM adk_app_states aps WHERE aps.app_name = a.app_name) AS app_state
      INTO s
      FROM adk_sessions a
     WHERE a.app_name = p_app_name AND a.user_id = p_user_id AND a.session_id = p_session_id
       AND (a.expires_at IS NULL OR a.expires_at > pg_catalog.now());
    IF NOT FOUND THEN
        RETURN;
    END IF;
    RETURN QUERY SELECT s.state, s.last_seq, s.session_day, s.created_at, s.updated_at, s.expires_at,
                        s.closed_at, s.successor_id, s.user_state, s.app_state, NULL::jsonb;
    IF s.last_seq = 0 OR p_limit = 0 THEN
        RETURN;
    END IF;
    -- The one read of a partition, planned with its arguments on every call
    -- (EXECUTE): a cached generic plan made while the day's partition was
    -- small would go on scanning it sequentially once it filled. The session
    -- read above is by primary key and keeps its cached plan.
    RETURN QUERY EXECUTE
        'SELECT NULL::jsonb, NULL::bigint, NULL::date, NULL::timestamptz, NULL::timestamptz,
                NULL::timestamptz, NULL::timestamptz, NULL::text, NULL::jsonb, NULL::jsonb, recent.payload
           FROM (SELECT e.seq, e.payload FROM adk_events e
                  WHERE e.app_name = $1 AND e.user_id = $2 AND e.session_id = $3 AND e.session_day = $4
                    AND e.seq <= $5 AND ($6::bigint IS NULL OR e.event_ts >= $6)
                  ORDER BY e.seq DESC
                  LIMIT $7) recent
          ORDER BY recent.seq'
        USING p_app_name, p_user_id, p_session_id, s.session_day, s.last_seq, p_after_ts, p_limit;
END;
$$;

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
SECURITY DEFINER
AS $$
#variable_conflict use_column
BEGIN
    IF NOT adk_tenant_allows(p_tenant, p_app_name) THEN
        RETURN;
    END IF;
    RETURN QUERY
    SELECT s.session_id, s.state, s.last_seq, s.created_at, s.updated_at, s.expires_at,
           CASE WHEN pg_catalog.row_number() OVER w = 1 THEN
               (SELECT us.state FROM adk_user_states us WHERE us.app_name = p_app_name AND us.user_id = p_user_id)
           END,
           CASE WHEN pg_catalog.row_number() OVER w = 1 THEN
               (SELECT aps.state FROM adk_app_states aps WHERE aps.app_name = p_app_name)
           END
    FROM adk_sessions s
    WHERE s.app_name = p_app_name AND s.user_id = p_user_id
      AND (s.expires_at IS NULL OR s.expires_at > pg_catalog.now())
      AND (p_after_time IS NULL OR (s.updated_at, s.session_id) < (p_after_time, p_after_id))
    WINDOW w AS (ORDER BY s.updated_at DESC, s.session_id DESC)
    ORDER BY s.updated_at DESC, s.session_id DESC
    LIMIT p_limit;
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
SECURITY DEFINER
AS $$
#variable_conflict use_column
DECLARE
    old  record;
    born record;
    ttl  interval;
BEGIN
    IF NOT adk_tenant_allows(p_tenant, p_app_name) THEN
        PERFORM adk_tenant_require(p_tenant, p_app_name);
    END IF;
    SELECT a.state, a.expires_at, a.closed_at, a.successor_id
      INTO old
      FROM adk_sessions a
     WHERE a.app_name = p_app_name AND a.user_id = p_user_id AND a.session_id = p_session_id
       FOR NO KEY UPDATE;
    IF NOT FOUND OR (old.expires_at IS NOT NULL AND old.expires_at <= pg_catalog.now()) THEN
        RETURN QUERY SELECT 'not_found'::text, NULL::jsonb, NULL::timestamptz, NULL::timestamptz,
                            NULL::timestamptz, NULL::text;
        RETURN;
    END IF;
    IF old.closed_at IS NOT NULL THEN
        RETURN QUERY SELECT CASE WHEN old.successor_id = p_successor_id THEN 'rolled' ELSE 'closed' END,
                            NULL::jsonb, NULL::timestamptz, NULL::timestamptz, NULL::timestamptz,
                            old.successor_id;
        RETURN;
    END IF;

    SELECT least(adk_policy_seconds(p_ttl), adk_policy_seconds(p.default_ttl)) INTO ttl FROM adk_store_policy p;
    INSERT INTO adk_sessions (app_name, user_id, session_id, state, initial_state, last_seq, expires_at)
    VALUES (p_app_name, p_user_id, p_successor_id, old.state, old.state, 1, pg_catalog.now() + ttl)
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
       SET closed_at = pg_catalog.now(), successor_id = p_successor_id, updated_at = greatest(pg_catalog.now(), a.updated_at)
     WHERE a.app_name = p_app_name AND a.user_id = p_user_id AND a.session_id = p_session_id;

    RETURN QUERY SELECT 'rolled'::text, old.state, born.created_at, born.updated_at, born.expires_at,
                        p_successor_id;
END;
$$;

DO $$
DECLARE
    f regprocedure;
    r regrole;
BEGIN
    FOREACH f IN ARRAY ARRAY[
        'adk_create_session(text, text, text, text, jsonb, interval, jsonb, jsonb)',
        'adk_get_session(text, text, text, text, bigint, bigint)',
        'adk_list_sessions(text, text, text, timestamptz, text, bigint)',
        'adk_rollover_session(text, text, text, text, text, text, text, text, bigint, jsonb, interval)'
    ]::regprocedure[] LOOP
        EXECUTE pg_catalog.format('ALTER FUNCTION %s SET search_path = pg_catalog, %I, pg_temp',
                                  f, pg_catalog.current_schema());
        EXECUTE pg_catalog.format('REVOKE EXECUTE ON FUNCTION %s FROM PUBLIC', f);
    END LOOP;
    FOR r IN SELECT DISTINCT b.role_oid::regrole FROM adk_role_apps b
              WHERE EXISTS (SELECT FROM pg_catalog.pg_roles x WHERE x.oid = b.role_oid) LOOP
        FOREACH f IN ARRAY ARRAY[
            'adk_create_session(text, text, text, text, jsonb, interval, jsonb, jsonb)',
            'adk_get_session(text, text, text, text, bigint, bigint)',
            'adk_list_sessions(text, text, text, timestamptz, text, bigint)'
        ]::regprocedure[] LOOP
            EXECUTE pg_catalog.format('GRANT EXECUTE ON FUNCTION %s TO %s', f, r);
        END LOOP;
    END LOOP;
END;
$$;

DROP INDEX adk_sessions_labels;
DROP TRIGGER adk_sessions_metadata_checks ON adk_sessions;
DROP FUNCTION adk_session_metadata_check();
ALTER TABLE adk_sessions
    DROP COLUMN labels,
    DROP COLUMN display_name;
