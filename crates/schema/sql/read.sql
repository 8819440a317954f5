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
--
-- The get in one row: the events come as one jsonb[] rather than a row
-- each, which had cost the client a row's handling per event, twelve NULL
-- columns included, and the wire 11% more bytes (issue 37).
CREATE OR REPLACE FUNCTION adk_read_session(p_tenant text, p_app_name text, p_user_id text, p_session_id text, p_after_ts bigint, p_limit bigint)
 RETURNS TABLE(state jsonb, last_seq bigint, session_day date, created_at timestamp with time zone, updated_at timestamp with time zone, expires_at timestamp with time zone, closed_at timestamp with time zone, successor_id text, display_name text, labels jsonb, user_state jsonb, app_state jsonb, events jsonb[])
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
    IF s.last_seq = 0 OR p_limit = 0 THEN
        RETURN QUERY SELECT s.state, s.last_seq, s.session_day, s.created_at, s.updated_at, s.expires_at,
                            s.closed_at, s.successor_id, s.display_name, s.labels, s.user_state, s.app_state,
                            '{}'::jsonb[];
        RETURN;
    END IF;
    -- A static statement, so its plan is kept: generic (the function's
    -- plan_cache_mode), so it is never planned again and prunes to the
    -- session's partition as it starts, whatever the number of partitions;
    -- and made with sequential scans off, so a plan made while the day's
    -- partition was small reads it by index once it has filled.
    RETURN QUERY
    SELECT s.state, s.last_seq, s.session_day, s.created_at, s.updated_at, s.expires_at,
           s.closed_at, s.successor_id, s.display_name, s.labels, s.user_state, s.app_state,
           coalesce(pg_catalog.array_agg(recent.payload ORDER BY recent.seq), '{}'::jsonb[])
      FROM (SELECT e.seq, e.payload FROM adk_events e
             WHERE e.app_name = p_app_name AND e.user_id = p_user_id AND e.session_id = p_session_id
               AND e.session_day = s.session_day AND e.seq <= s.last_seq
               AND (p_after_ts IS NULL OR e.event_ts >= p_after_ts)
             ORDER BY e.seq DESC
             LIMIT p_limit) recent;
END;
$$;
REVOKE EXECUTE ON FUNCTION adk_read_session(p_tenant text, p_app_name text, p_user_id text, p_session_id text, p_after_ts bigint, p_limit bigint) FROM PUBLIC;

-- The get as the store sent it before adk_read_session (a row per event),
-- kept for a service still running such a build while its schema moves on
-- in a rolling deploy, and for SQL callers. Its rows are adk_read_session's
-- one row unnested, so the two cannot differ.
CREATE OR REPLACE FUNCTION adk_get_session(p_tenant text, p_app_name text, p_user_id text, p_session_id text, p_after_ts bigint, p_limit bigint)
 RETURNS TABLE(state jsonb, last_seq bigint, session_day date, created_at timestamp with time zone, updated_at timestamp with time zone, expires_at timestamp with time zone, closed_at timestamp with time zone, successor_id text, display_name text, labels jsonb, user_state jsonb, app_state jsonb, payload jsonb)
 LANGUAGE plpgsql
 STABLE SECURITY DEFINER
SET search_path = pg_catalog, :"store_schema", pg_temp
AS $$
#variable_conflict use_column
DECLARE
    s record;
BEGIN
    SELECT * INTO s FROM adk_read_session(p_tenant, p_app_name, p_user_id, p_session_id, p_after_ts, p_limit);
    IF NOT FOUND THEN
        RETURN;
    END IF;
    RETURN QUERY SELECT s.state, s.last_seq, s.session_day, s.created_at, s.updated_at, s.expires_at,
                        s.closed_at, s.successor_id, s.display_name, s.labels, s.user_state, s.app_state,
                        NULL::jsonb;
    RETURN QUERY
    SELECT NULL::jsonb, NULL::bigint, NULL::date, NULL::timestamptz, NULL::timestamptz, NULL::timestamptz,
           NULL::timestamptz, NULL::text, NULL::text, NULL::jsonb, NULL::jsonb, NULL::jsonb, e.payload
      FROM pg_catalog.unnest(s.events) WITH ORDINALITY AS e(payload, n)
     ORDER BY e.n;
END;
$$;
REVOKE EXECUTE ON FUNCTION adk_get_session(p_tenant text, p_app_name text, p_user_id text, p_session_id text, p_after_ts bigint, p_limit bigint) FROM PUBLIC;
SELECT adk_grant_like('adk_read_session(text, text, text, text, bigint, bigint)', 'adk_get_session(text, text, text, text, bigint, bigint)');

-- The list in one row: the page's sessions as one array per column, in the
-- page's order, with the live user and app state once beside them. A row
-- per session had cost the client a row's handling each (a name lookup per
-- column per row among them) and the server a window function to put the
-- user and app state on the first row only (issue 37).
--
-- Each array is aggregated from the page's subquery in its ORDER BY order
-- (a sorted subquery feeding an aggregate, as PostgreSQL documents for
-- array_agg) rather than by an ORDER BY per aggregate, which on PostgreSQL
-- 15 would sort the page once per column.
CREATE OR REPLACE FUNCTION adk_read_sessions(
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
    session_ids   text[],
    states        jsonb[],
    last_seqs     bigint[],
    created_ats   timestamptz[],
    updated_ats   timestamptz[],
    expires_ats   timestamptz[],
    display_names text[],
    label_sets    jsonb[],
    user_state    jsonb,
    app_state     jsonb
)
LANGUAGE plpgsql
STABLE SECURITY DEFINER
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
        SELECT coalesce(pg_catalog.array_agg(p.session_id), '{}'), coalesce(pg_catalog.array_agg(p.state), '{}'),
               coalesce(pg_catalog.array_agg(p.last_seq), '{}'), coalesce(pg_catalog.array_agg(p.created_at), '{}'),
               coalesce(pg_catalog.array_agg(p.updated_at), '{}'), coalesce(pg_catalog.array_agg(p.expires_at), '{}'),
               coalesce(pg_catalog.array_agg(p.display_name), '{}'), coalesce(pg_catalog.array_agg(p.labels), '{}'),
               (SELECT us.state FROM adk_user_states us WHERE us.app_name = p_app_name AND us.user_id = p_user_id),
               (SELECT aps.state FROM adk_app_states aps WHERE aps.app_name = p_app_name)
          FROM (SELECT s.session_id, s.state, s.last_seq, s.created_at, s.updated_at, s.expires_at,
                       s.display_name, s.labels
                  FROM adk_sessions s
                 WHERE s.app_name = p_app_name AND s.user_id = p_user_id
                   AND (s.expires_at IS NULL OR s.expires_at > pg_catalog.now())
                   AND (p_updated_after IS NULL OR s.updated_at >= p_updated_after)
                   AND (p_updated_before IS NULL OR s.updated_at < p_updated_before)
                   AND (p_after_time IS NULL OR (s.updated_at, s.session_id) < (p_after_time, p_after_id))
                 ORDER BY s.updated_at DESC, s.session_id DESC
                 LIMIT p_limit) p;
        RETURN;
    END IF;
    RETURN QUERY EXECUTE
        'SELECT coalesce(pg_catalog.array_agg(p.session_id), ''{}''), coalesce(pg_catalog.array_agg(p.state), ''{}''),
                coalesce(pg_catalog.array_agg(p.last_seq), ''{}''), coalesce(pg_catalog.array_agg(p.created_at), ''{}''),
                coalesce(pg_catalog.array_agg(p.updated_at), ''{}''), coalesce(pg_catalog.array_agg(p.expires_at), ''{}''),
                coalesce(pg_catalog.array_agg(p.display_name), ''{}''), coalesce(pg_catalog.array_agg(p.labels), ''{}''),
                (SELECT us.state FROM adk_user_states us WHERE us.app_name = $1 AND us.user_id = $2),
                (SELECT aps.state FROM adk_app_states aps WHERE aps.app_name = $1)
           FROM (SELECT s.session_id, s.state, s.last_seq, s.created_at, s.updated_at, s.expires_at,
                        s.display_name, s.labels
                   FROM adk_sessions s
                  WHERE s.app_name = $1 AND s.user_id = $2
                    AND s.labels OPERATOR(pg_catalog.@>) $3 AND s.labels OPERATOR(pg_catalog.<>) ''{}''::jsonb
                    AND (s.expires_at IS NULL OR s.expires_at > pg_catalog.now())
                    AND ($4::timestamptz IS NULL OR s.updated_at >= $4)
                    AND ($5::timestamptz IS NULL OR s.updated_at < $5)
                    AND ($6::timestamptz IS NULL OR (s.updated_at, s.session_id) < ($6, $7))
                  ORDER BY s.updated_at DESC, s.session_id DESC
                  LIMIT $8) p'
        USING p_app_name, p_user_id, p_labels, p_updated_after, p_updated_before, p_after_time, p_after_id,
              p_limit;
END;
$$;
REVOKE EXECUTE ON FUNCTION adk_read_sessions(p_tenant text, p_app_name text, p_user_id text, p_after_time timestamp with time zone, p_after_id text, p_limit bigint, p_labels jsonb, p_updated_after timestamp with time zone, p_updated_before timestamp with time zone) FROM PUBLIC;

-- The list as the store sent it before adk_read_sessions (a row per
-- session, the user and app state on the first), kept for a service still
-- running such a build while its schema moves on in a rolling deploy, and
-- for SQL callers. Its rows are adk_read_sessions' one row unnested, so the
-- two cannot differ.
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
AS $$
#variable_conflict use_column
DECLARE
    p record;
BEGIN
    SELECT * INTO p
      FROM adk_read_sessions(p_tenant, p_app_name, p_user_id, p_after_time, p_after_id, p_limit, p_labels,
                             p_updated_after, p_updated_before);
    IF NOT FOUND THEN
        RETURN;
    END IF;
    RETURN QUERY
    SELECT s.session_id, s.state, s.last_seq, s.created_at, s.updated_at, s.expires_at, s.display_name, s.labels,
           CASE WHEN s.n = 1 THEN p.user_state END,
           CASE WHEN s.n = 1 THEN p.app_state END
      -- ROWS FROM rather than unnest's many-array form, which only the
      -- unqualified name takes: the arrays side by side, element by element.
      FROM ROWS FROM (pg_catalog.unnest(p.session_ids), pg_catalog.unnest(p.states), pg_catalog.unnest(p.last_seqs),
                      pg_catalog.unnest(p.created_ats), pg_catalog.unnest(p.updated_ats),
                      pg_catalog.unnest(p.expires_ats), pg_catalog.unnest(p.display_names),
                      pg_catalog.unnest(p.label_sets))
           WITH ORDINALITY AS s(session_id, state, last_seq, created_at, updated_at, expires_at, display_name,
                                labels, n)
     ORDER BY s.n;
END;
$$;
REVOKE EXECUTE ON FUNCTION adk_list_sessions(p_tenant text, p_app_name text, p_user_id text, p_after_time timestamp with time zone, p_after_id text, p_limit bigint, p_labels jsonb, p_updated_after timestamp with time zone, p_updated_before timestamp with time zone) FROM PUBLIC;
SELECT adk_grant_like(
    'adk_read_sessions(text, text, text, timestamp with time zone, text, bigint, jsonb, timestamp with time zone, timestamp with time zone)',
    'adk_list_sessions(text, text, text, timestamp with time zone, text, bigint, jsonb, timestamp with time zone, timestamp with time zone)');

-- One page of a session's events without the session (list_events):
-- forward after p_after, or backward before p_before (exactly one of them),
-- at most p_limit + 1 events so the caller tells whether more follow. The
-- first row is the header (the version, no seq); the events follow in the
-- page's direction. STABLE, so both reads see the calling statement's one
-- snapshot, and only events up to the version read are returned: an append
-- racing the page (which commits its event and the new last_seq together)
-- is either wholly in it or not at all.
-- Each direction is its own static statement, kept as a generic plan made
-- with sequential scans off, as the get's: it reads the session's one
-- partition by its primary key, pruned as the plan starts.
CREATE OR REPLACE FUNCTION adk_list_events(p_tenant text, p_app_name text, p_user_id text, p_session_id text, p_after bigint, p_before bigint, p_limit bigint)
 RETURNS TABLE(last_seq bigint, seq bigint, payload jsonb)
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
    IF (p_after IS NULL) = (p_before IS NULL) THEN
        RAISE EXCEPTION 'exactly one of p_after and p_before must be given'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF coalesce(p_after, 0) < 0 OR coalesce(p_before, 0) < 0 THEN
        RAISE EXCEPTION 'p_after and p_before must be 0 or more'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF p_limit IS NULL OR p_limit < 1 OR p_limit > 1000 THEN
        RAISE EXCEPTION 'p_limit must be 1 to 1000, not %', coalesce(p_limit::text, 'NULL')
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF NOT adk_tenant_allows(p_tenant, p_app_name) THEN
        RETURN;
    END IF;
    SELECT a.last_seq, a.session_day
      INTO s
      FROM adk_sessions a
     WHERE a.app_name = p_app_name AND a.user_id = p_user_id AND a.session_id = p_session_id
       AND (a.expires_at IS NULL OR a.expires_at > pg_catalog.now());
    IF NOT FOUND THEN
        RETURN;
    END IF;
    RETURN QUERY SELECT s.last_seq, NULL::bigint, NULL::jsonb;
    IF s.last_seq = 0 OR (p_after IS NOT NULL AND p_after >= s.last_seq) OR p_before <= 1 THEN
        RETURN;
    END IF;
    IF p_after IS NOT NULL THEN
        RETURN QUERY
        SELECT NULL::bigint, e.seq, e.payload
          FROM adk_events e
         WHERE e.app_name = p_app_name AND e.user_id = p_user_id AND e.session_id = p_session_id
           AND e.session_day = s.session_day AND e.seq > p_after AND e.seq <= s.last_seq
         ORDER BY e.seq
         LIMIT p_limit + 1;
    ELSE
        RETURN QUERY
        SELECT NULL::bigint, e.seq, e.payload
          FROM adk_events e
         WHERE e.app_name = p_app_name AND e.user_id = p_user_id AND e.session_id = p_session_id
           AND e.session_day = s.session_day AND e.seq < p_before AND e.seq <= s.last_seq
         ORDER BY e.seq DESC
         LIMIT p_limit + 1;
    END IF;
END;
$$;
REVOKE EXECUTE ON FUNCTION adk_list_events(p_tenant text, p_app_name text, p_user_id text, p_session_id text, p_after bigint, p_before bigint, p_limit bigint) FROM PUBLIC;
SELECT adk_grant_like('adk_list_events(text, text, text, text, bigint, bigint, bigint)', 'adk_get_session(text, text, text, text, bigint, bigint)');

-- One keyset page of an app's live sessions across its users, newest
-- created first (list_app_sessions), for the owner and roles bound to the
-- app: any other caller is refused (42501), not answered with an empty
-- page, since an admin tool must tell "no sessions" from "not yours".
-- Ordered by creation because an append moves updated_at and must stay HOT:
-- no index holds updated_at, while adk_sessions_app_created (migration 30)
-- holds this order, so a page reads p_limit rows of the index whatever the
-- size of the app. The first row is the header with the live app state
-- (no session); every session row carries its user's live state, joined by
-- the distribution column so Citus runs the join on each worker.
CREATE OR REPLACE FUNCTION adk_list_app_sessions(
    p_tenant         text,
    p_app_name       text,
    p_after_created  timestamptz,
    p_after_user     text,
    p_after_session  text,
    p_limit          bigint,
    p_labels         jsonb,
    p_updated_after  timestamptz,
    p_updated_before timestamptz
) RETURNS TABLE (
    user_id      text,
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
STABLE SECURITY DEFINER
SET search_path = pg_catalog, :"store_schema", pg_temp
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
AS $$
#variable_conflict use_column
BEGIN
    IF p_limit IS NULL OR p_limit < 1 OR p_limit > 201 THEN
        RAISE EXCEPTION 'p_limit must be 1 to 201, not %', coalesce(p_limit::text, 'NULL')
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF p_after_created IS NOT NULL AND (p_after_user IS NULL OR p_after_session IS NULL) THEN
        RAISE EXCEPTION 'a position names its creation time, user and session'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    PERFORM adk_tenant_require(p_tenant, p_app_name);
    RETURN QUERY
    SELECT NULL::text, NULL::text, NULL::jsonb, NULL::bigint, NULL::timestamptz, NULL::timestamptz,
           NULL::timestamptz, NULL::text, NULL::jsonb, NULL::jsonb,
           (SELECT aps.state FROM adk_app_states aps WHERE aps.app_name = p_app_name);
    RETURN QUERY
    SELECT s.user_id, s.session_id, s.state, s.last_seq, s.created_at, s.updated_at, s.expires_at,
           s.display_name, s.labels, us.state, NULL::jsonb
      FROM adk_sessions s
      LEFT JOIN adk_user_states us ON us.app_name = s.app_name AND us.user_id = s.user_id
     WHERE s.app_name = p_app_name
       AND (s.expires_at IS NULL OR s.expires_at > pg_catalog.now())
       AND s.labels OPERATOR(pg_catalog.@>) coalesce(p_labels, '{}'::jsonb)
       AND (p_updated_after IS NULL OR s.updated_at >= p_updated_after)
       AND (p_updated_before IS NULL OR s.updated_at < p_updated_before)
       AND (p_after_created IS NULL
            OR (s.created_at, s.user_id, s.session_id) < (p_after_created, p_after_user, p_after_session))
     ORDER BY s.created_at DESC, s.user_id DESC, s.session_id DESC
     LIMIT p_limit;
END;
$$;
REVOKE EXECUTE ON FUNCTION adk_list_app_sessions(p_tenant text, p_app_name text, p_after_created timestamp with time zone, p_after_user text, p_after_session text, p_limit bigint, p_labels jsonb, p_updated_after timestamp with time zone, p_updated_before timestamp with time zone) FROM PUBLIC;
SELECT adk_grant_like('adk_list_app_sessions(text, text, timestamp with time zone, text, text, bigint, jsonb, timestamp with time zone, timestamp with time zone)', 'adk_get_session(text, text, text, text, bigint, bigint)');
