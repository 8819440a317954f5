-- The reads: a session with its events in one round trip, and the list of
-- a user's sessions, one page at a time.
--
-- Installed after every migrate, in one transaction with the other files
-- (crates/schema/src/replaceable.rs). Each function is stated whole, with
-- its SET clauses and grants: change it here, not in a migration.

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
-- starts, so one plan serves every day. tests/tests/store/plan_cache.rs pins both.
CREATE OR REPLACE FUNCTION adk_get_session(p_tenant text, p_app_name text, p_user_id text, p_session_id text, p_after_ts bigint, p_limit bigint)
 RETURNS TABLE(state jsonb, last_seq bigint, session_day date, created_at timestamp with time zone, updated_at timestamp with time zone, expires_at timestamp with time zone, closed_at timestamp with time zone, successor_id text, display_name text, labels jsonb, user_state jsonb, app_state jsonb, payload jsonb)
 LANGUAGE plpgsql
 STABLE SECURITY DEFINER
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
SET search_path = pg_catalog, :"store_schema", pg_temp
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
REVOKE EXECUTE ON FUNCTION adk_get_session(p_tenant text, p_app_name text, p_user_id text, p_session_id text, p_after_ts bigint, p_limit bigint) FROM PUBLIC;

CREATE OR REPLACE FUNCTION adk_list_sessions(
    p_tenant         text,
    p_app_name       text,
    p_user_id        text,
    p_after_time     timestamptz,
    p_after_id       text,
    p_limit          bigint,
    p_labels         jsonb DEFAULT '{}',
    p_updated_after  timestamptz DEFAULT NULL,
    p_updated_before timestamptz DEFAULT NULL
) RETURNS TABLE (
    session_id   text,
    state        jsonb,
    last_seq     bigint,
    created_at   timestamptz,
    updated_at   timestamptz,
    expires_at   timestamptz,
    display_name text,
    labels       jsonb,
    user_state   jsonb,
    app_state    jsonb
)
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, :"store_schema", pg_temp
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
AS $$
#variable_conflict use_column
BEGIN
    IF NOT adk_tenant_allows(p_tenant, p_app_name) THEN
        RETURN;
    END IF;
    IF p_labels IS NULL OR p_labels = '{}'::jsonb THEN
        RETURN QUERY
        SELECT s.session_id, s.state, s.last_seq, s.created_at, s.updated_at, s.expires_at, s.display_name,
               s.labels,
               CASE WHEN pg_catalog.row_number() OVER w = 1 THEN
                   (SELECT us.state FROM adk_user_states us WHERE us.app_name = p_app_name AND us.user_id = p_user_id)
               END,
               CASE WHEN pg_catalog.row_number() OVER w = 1 THEN
                   (SELECT aps.state FROM adk_app_states aps WHERE aps.app_name = p_app_name)
               END
        FROM adk_sessions s
        WHERE s.app_name = p_app_name AND s.user_id = p_user_id
          AND (s.expires_at IS NULL OR s.expires_at > pg_catalog.now())
          AND (p_updated_after IS NULL OR s.updated_at >= p_updated_after)
          AND (p_updated_before IS NULL OR s.updated_at < p_updated_before)
          AND (p_after_time IS NULL OR (s.updated_at, s.session_id) < (p_after_time, p_after_id))
        WINDOW w AS (ORDER BY s.updated_at DESC, s.session_id DESC)
        ORDER BY s.updated_at DESC, s.session_id DESC
        LIMIT p_limit;
        RETURN;
    END IF;
    RETURN QUERY EXECUTE
        'SELECT s.session_id, s.state, s.last_seq, s.created_at, s.updated_at, s.expires_at, s.display_name,
                s.labels,
                CASE WHEN pg_catalog.row_number() OVER w = 1 THEN
                    (SELECT us.state FROM adk_user_states us WHERE us.app_name = $1 AND us.user_id = $2)
                END,
                CASE WHEN pg_catalog.row_number() OVER w = 1 THEN
                    (SELECT aps.state FROM adk_app_states aps WHERE aps.app_name = $1)
                END
           FROM adk_sessions s
          WHERE s.app_name = $1 AND s.user_id = $2
            AND s.labels OPERATOR(pg_catalog.@>) $3 AND s.labels OPERATOR(pg_catalog.<>) ''{}''::jsonb
            AND (s.expires_at IS NULL OR s.expires_at > pg_catalog.now())
            AND ($4::timestamptz IS NULL OR s.updated_at >= $4)
            AND ($5::timestamptz IS NULL OR s.updated_at < $5)
            AND ($6::timestamptz IS NULL OR (s.updated_at, s.session_id) < ($6, $7))
         WINDOW w AS (ORDER BY s.updated_at DESC, s.session_id DESC)
         ORDER BY s.updated_at DESC, s.session_id DESC
         LIMIT $8'
        USING p_app_name, p_user_id, p_labels, p_updated_after, p_updated_before, p_after_time, p_after_id,
              p_limit;
END;
$$;
REVOKE EXECUTE ON FUNCTION adk_list_sessions(p_tenant text, p_app_name text, p_user_id text, p_after_time timestamp with time zone, p_after_id text, p_limit bigint, p_labels jsonb, p_updated_after timestamp with time zone, p_updated_before timestamp with time zone) FROM PUBLIC;
