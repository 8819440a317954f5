-- The live change feed: the channel a tenant listens on, the triggers that
-- notify it (installed or removed by adk_set_change_feed), and the read of
-- events after a seq that a listener catches up with.
--
-- Installed after every migrate, in one transaction with the other files
-- (crates/schema/src/replaceable.rs). Each function is stated whole, with
-- its SET clauses and grants: change it here, not in a migration.

-- The channel an app's notices go to. Channel names are identifiers, at most
-- 63 bytes, and app names may be 128 characters, so the name is hashed.
-- SHA-256, not md5: md5() fails on a server whose OpenSSL runs in FIPS mode.
-- 128 bits of it keep collisions out of reach. An SQL-standard body, bound
-- when it is created and inlined where it is called. STABLE, not IMMUTABLE,
-- because convert_to is STABLE: PostgreSQL refuses to inline an IMMUTABLE
-- function whose body is not, and a function that is not inlined is planned
-- again on every call. It runs once per stored event: inlined, the event
-- trigger costs about 7 µs a row instead of 19 µs (50,000-row insert,
-- PostgreSQL 15).
CREATE OR REPLACE FUNCTION adk_feed_channel(p_app_name text) RETURNS text
    LANGUAGE sql STABLE STRICT PARALLEL SAFE
    RETURN 'adk_feed_' || pg_catalog.left(
        pg_catalog.encode(pg_catalog.sha256(pg_catalog.convert_to(p_app_name, 'UTF8')), 'hex'), 32);
REVOKE EXECUTE ON FUNCTION adk_feed_channel(p_app_name text) FROM PUBLIC;

-- Whether every trigger of the feed is in place and enabled (on the
-- parents; partitions carry clones of the event trigger).
CREATE OR REPLACE FUNCTION adk_change_feed_enabled() RETURNS boolean
    LANGUAGE sql STABLE
    RETURN (SELECT pg_catalog.count(*) = 5 FROM pg_catalog.pg_trigger t
             WHERE t.tgenabled <> 'D' AND t.tgparentid = 0
               AND ((t.tgrelid = 'adk_events'::regclass AND t.tgname = 'adk_feed_event')
                    OR (t.tgrelid = 'adk_sessions'::regclass
                        AND t.tgname IN ('adk_feed_session_created', 'adk_feed_session_closed',
                                         'adk_feed_session_rewound', 'adk_feed_session_deleted'))));
REVOKE EXECUTE ON FUNCTION adk_change_feed_enabled() FROM PUBLIC;

-- One notice per stored event. An AFTER row trigger on the partitioned
-- parent is cloned to every partition, those that exist and those created or
-- attached later, so maintenance needs to know nothing about it. It runs as
-- the writer, which for the store's functions is the tables' owner.
CREATE OR REPLACE FUNCTION adk_feed_event_notify() RETURNS trigger
LANGUAGE plpgsql
SET search_path = pg_catalog, :"store_schema", pg_temp
AS $$
BEGIN
    PERFORM pg_catalog.pg_notify(adk_feed_channel(NEW.app_name),
                                 pg_catalog.json_build_array('e', NEW.user_id, NEW.session_id, NEW.seq)::text);
    RETURN NULL;
END;
$$;
REVOKE EXECUTE ON FUNCTION adk_feed_event_notify() FROM PUBLIC;

-- One notice per created, closed, rewound or deleted session; the kind is
-- the trigger's argument.
CREATE OR REPLACE FUNCTION adk_feed_session_notify() RETURNS trigger
LANGUAGE plpgsql
SET search_path = pg_catalog, :"store_schema", pg_temp
AS $$
DECLARE
    r record;
BEGIN
    IF TG_OP = 'DELETE' THEN
        r := OLD;
    ELSE
        r := NEW;
    END IF;
    PERFORM pg_catalog.pg_notify(adk_feed_channel(r.app_name),
                                 pg_catalog.json_build_array(TG_ARGV[0], r.user_id, r.session_id, r.last_seq)::text);
    RETURN NULL;
END;
$$;
REVOKE EXECUTE ON FUNCTION adk_feed_session_notify() FROM PUBLIC;

-- The switch. On: creates whichever of the triggers is missing. Off: drops
-- them all, so nothing of the feed runs when a row is written. DDL on the
-- event log waits for the appends in flight and holds up new ones while it
-- waits, hence the short lock_timeout: a busy store refuses the switch
-- quickly instead of stalling its writers; run it again. Returns whether
-- anything changed. The owner's only: no service role may run it.
CREATE OR REPLACE FUNCTION adk_set_change_feed(p_enabled boolean) RETURNS boolean
LANGUAGE plpgsql STRICT
SET lock_timeout = '5s'
SET search_path = pg_catalog, :"store_schema", pg_temp
AS $$
DECLARE
    triggers CONSTANT text[][] := ARRAY[
        -- name, table, timing and event, condition, function and argument
        ARRAY['adk_feed_event', 'adk_events', 'AFTER INSERT', '', 'adk_feed_event_notify()'],
        ARRAY['adk_feed_session_created', 'adk_sessions', 'AFTER INSERT', '', 'adk_feed_session_notify(''c'')'],
        -- UPDATE OF closed_at: an append's UPDATE does not name closed_at,
        -- so this trigger is not even considered on the append path.
        ARRAY['adk_feed_session_closed', 'adk_sessions', 'AFTER UPDATE OF closed_at',
              'WHEN (OLD.closed_at IS NULL AND NEW.closed_at IS NOT NULL)', 'adk_feed_session_notify(''x'')'],
        -- An append names last_seq, so its update evaluates this condition
        -- (a comparison of two columns, no function call, no notice).
        ARRAY['adk_feed_session_rewound', 'adk_sessions', 'AFTER UPDATE OF last_seq',
              'WHEN (NEW.last_seq < OLD.last_seq)', 'adk_feed_session_notify(''r'')'],
        ARRAY['adk_feed_session_deleted', 'adk_sessions', 'AFTER DELETE', '', 'adk_feed_session_notify(''d'')']
    ];
    changed boolean := false;
    i       integer;
BEGIN
    FOR i IN 1 .. pg_catalog.array_length(triggers, 1) LOOP
        IF p_enabled AND NOT EXISTS (SELECT FROM pg_catalog.pg_trigger t
                                      WHERE t.tgrelid = triggers[i][2]::regclass AND t.tgname = triggers[i][1]) THEN
            EXECUTE pg_catalog.format('CREATE TRIGGER %I %s ON %I FOR EACH ROW %s EXECUTE FUNCTION %s',
                                      triggers[i][1], triggers[i][3], triggers[i][2], triggers[i][4],
                                      triggers[i][5]);
            changed := true;
        ELSIF NOT p_enabled AND EXISTS (SELECT FROM pg_catalog.pg_trigger t
                                         WHERE t.tgrelid = triggers[i][2]::regclass
                                           AND t.tgname = triggers[i][1]) THEN
            EXECUTE pg_catalog.format('DROP TRIGGER %I ON %I', triggers[i][1], triggers[i][2]);
            changed := true;
        END IF;
    END LOOP;
    RETURN changed;
END;
$$;
REVOKE EXECUTE ON FUNCTION adk_set_change_feed(p_enabled boolean) FROM PUBLIC;

-- Starts listening, on the caller's connection, for the notices of one app,
-- and returns the channel and this connection's server process (for
-- operators matching a watcher with pg_stat_activity, and for tests that
-- cut it). The tenant check comes first, as in every store function: a
-- refused role gets 42501 and listens to nothing. LISTEN takes effect when
-- the call commits. Refuses when the feed is off: a watcher would otherwise
-- wait for notices that never come.
CREATE OR REPLACE FUNCTION adk_feed_listen(p_tenant text, p_app_name text)
RETURNS TABLE (channel text, backend_pid integer)
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, :"store_schema", pg_temp
AS $$
#variable_conflict use_column
DECLARE
    ch text;
BEGIN
    IF NOT adk_tenant_allows(p_tenant, p_app_name) THEN
        PERFORM adk_tenant_require(p_tenant, p_app_name);
    END IF;
    IF NOT adk_change_feed_enabled() THEN
        RAISE EXCEPTION 'the change feed is turned off'
            USING ERRCODE = 'object_not_in_prerequisite_state',
                  HINT = 'the store''s owner turns it on with SELECT adk_set_change_feed(true)';
    END IF;
    ch := adk_feed_channel(p_app_name);
    EXECUTE pg_catalog.format('LISTEN %I', ch);
    RETURN QUERY SELECT ch, pg_catalog.pg_backend_pid();
END;
$$;
REVOKE EXECUTE ON FUNCTION adk_feed_listen(p_tenant text, p_app_name text) FROM PUBLIC;

-- The change feed's event read on a kept plan instead of through EXECUTE,
-- as migration 20 did for the get: EXECUTE parsed and planned the read on
-- every call, and every plan looked at each partition's bounds. A generic
-- plan made with sequential scans off reads the session's partition by its
-- index whatever the statistics said when it was made, and prunes the other
-- partitions as it starts. tests/tests/store/plan_cache.rs holds the feed to that
-- on a warm connection after the partition has filled. On Citus the
-- distribution step plans the read per call instead, as for the get.
CREATE OR REPLACE FUNCTION adk_read_events_after(p_tenant text, p_app_name text, p_user_id text, p_session_id text, p_after_seq bigint, p_limit integer)
 RETURNS TABLE(last_seq bigint, created_at timestamp with time zone, expires_at timestamp with time zone, closed_at timestamp with time zone, successor_id text, seq bigint, event_id text, payload jsonb)
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
    IF p_after_seq IS NULL OR p_after_seq < 0 THEN
        RAISE EXCEPTION 'p_after_seq must be 0 or more, not %', coalesce(p_after_seq::text, 'NULL')
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF p_limit IS NULL OR p_limit < 1 THEN
        RAISE EXCEPTION 'p_limit must be 1 or more, not %', coalesce(p_limit::text, 'NULL')
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF NOT adk_tenant_allows(p_tenant, p_app_name) THEN
        RETURN;
    END IF;
    SELECT a.last_seq, a.session_day, a.created_at, a.expires_at, a.closed_at, a.successor_id
      INTO s
      FROM adk_sessions a
     WHERE a.app_name = p_app_name AND a.user_id = p_user_id AND a.session_id = p_session_id
       AND (a.expires_at IS NULL OR a.expires_at > pg_catalog.now());
    IF NOT FOUND THEN
        RETURN;
    END IF;
    RETURN QUERY SELECT s.last_seq, s.created_at, s.expires_at, s.closed_at, s.successor_id,
                        NULL::bigint, NULL::text, NULL::jsonb;
    IF s.last_seq = 0 OR s.last_seq < p_after_seq THEN
        RETURN;
    END IF;
    -- One generic plan, made once per connection with sequential scans off,
    -- as the get's (migration 20).
    RETURN QUERY
    SELECT NULL::bigint, NULL::timestamptz, NULL::timestamptz, NULL::timestamptz, NULL::text,
           e.seq, e.event_id, CASE WHEN e.seq > p_after_seq THEN e.payload END
      FROM adk_events e
     WHERE e.app_name = p_app_name AND e.user_id = p_user_id AND e.session_id = p_session_id
       AND e.session_day = s.session_day AND e.seq >= p_after_seq AND e.seq <= s.last_seq
     ORDER BY e.seq
     LIMIT p_limit::bigint + 1;
END;
$$;
REVOKE EXECUTE ON FUNCTION adk_read_events_after(p_tenant text, p_app_name text, p_user_id text, p_session_id text, p_after_seq bigint, p_limit integer) FROM PUBLIC;
