-- A live change feed (issue #16): a watcher follows a session's new events
-- in seq order, or an app's new sessions and events, without polling.
--
-- How it works:
--
-- * Row triggers on adk_events and adk_sessions send a NOTIFY on a channel
--   of the event's app. The payload is a JSON array of ids only,
--   [kind, user_id, session_id, seq]: never an event, never state. Kinds:
--   'e' an event was stored (seq: its seq), 'c' a session was created, 'x'
--   one was closed by a rollover, 'r' one was rewound, 'd' one was deleted
--   (seq: the session's last_seq after the change, or before a delete).
-- * A notification is only a hint that something changed: the watcher reads
--   what changed from the tables through adk_read_events_after, which makes
--   the same tenant check as every other store function. A notification can
--   be lost (the watcher's connection was down when it was sent) and anyone
--   may send one (see below), so the watcher never trusts the payload for
--   anything but "read again": it reads every event after the last one it
--   delivered, whatever the notification said.
--
-- What LISTEN exposes. PostgreSQL does not control who may LISTEN: any role
-- that can connect to the database can listen on any channel, and the
-- channel name is a public function of the app name. So a role that knows
-- an app's name can see the user ids, session ids and seqs of that app's
-- activity as it happens, and when it happens. It cannot see any event,
-- state or metadata beyond those ids: content is read only through
-- adk_read_events_after, which checks the acting role's binding like
-- adk_get_session does. adk_feed_listen checks the binding too, so the store
-- never listens for an app its role may not act for; that check keeps a
-- misconfigured service honest, it is not what protects the ids. Likewise
-- anyone may NOTIFY on any channel, so a notice is never evidence of
-- anything (the store's watchers read the tables to find out).
--
-- Cost. NOTIFY makes every notifying transaction take one lock for the
-- whole cluster at commit and hold it through the commit (its WAL flush
-- included), so that the queue's order is the commit order: notifying
-- commits happen one at a time and no longer share a WAL flush. Under eight
-- concurrent appenders that halves the appends a second (measured with
-- fsync on: 5,400-5,900 a second with the feed off, 2,800-3,100 on); the
-- triggers without their pg_notify cost next to nothing. The store's owner
-- can turn the feed off with adk_set_change_feed(false), which drops the
-- triggers (nothing of the feed then runs on the append path); watchers then
-- get an error instead of waiting for notices that never come. It is off
-- by default (adk-pg change-feed on turns it on): a store nobody watches
-- must not pay for notices.
--
-- Nothing here replaces a store function; the triggers see every write,
-- whichever function (or hand-written statement) makes it.

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
CREATE FUNCTION adk_feed_channel(p_app_name text) RETURNS text
    LANGUAGE sql STABLE STRICT PARALLEL SAFE
    RETURN 'adk_feed_' || pg_catalog.left(
        pg_catalog.encode(pg_catalog.sha256(pg_catalog.convert_to(p_app_name, 'UTF8')), 'hex'), 32);

-- One notice per stored event. An AFTER row trigger on the partitioned
-- parent is cloned to every partition, those that exist and those created or
-- attached later, so maintenance needs to know nothing about it. It runs as
-- the writer, which for the store's functions is the tables' owner.
CREATE FUNCTION adk_feed_event_notify() RETURNS trigger
LANGUAGE plpgsql
AS $$
BEGIN
    PERFORM pg_catalog.pg_notify(adk_feed_channel(NEW.app_name),
                                 pg_catalog.json_build_array('e', NEW.user_id, NEW.session_id, NEW.seq)::text);
    RETURN NULL;
END;
$$;

-- One notice per created, closed, rewound or deleted session; the kind is
-- the trigger's argument.
CREATE FUNCTION adk_feed_session_notify() RETURNS trigger
LANGUAGE plpgsql
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

-- Whether every trigger of the feed is in place and enabled (on the
-- parents; partitions carry clones of the event trigger).
CREATE FUNCTION adk_change_feed_enabled() RETURNS boolean
    LANGUAGE sql STABLE
    RETURN (SELECT pg_catalog.count(*) = 5 FROM pg_catalog.pg_trigger t
             WHERE t.tgenabled <> 'D' AND t.tgparentid = 0
               AND ((t.tgrelid = 'adk_events'::regclass AND t.tgname = 'adk_feed_event')
                    OR (t.tgrelid = 'adk_sessions'::regclass
                        AND t.tgname IN ('adk_feed_session_created', 'adk_feed_session_closed',
                                         'adk_feed_session_rewound', 'adk_feed_session_deleted'))));

-- The switch. On: creates whichever of the triggers is missing. Off: drops
-- them all, so nothing of the feed runs when a row is written. DDL on the
-- event log waits for the appends in flight and holds up new ones while it
-- waits, hence the short lock_timeout: a busy store refuses the switch
-- quickly instead of stalling its writers; run it again. Returns whether
-- anything changed. The owner's only: no service role may run it.
CREATE FUNCTION adk_set_change_feed(p_enabled boolean) RETURNS boolean
LANGUAGE plpgsql STRICT
SET lock_timeout = '5s'
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

-- Starts listening, on the caller's connection, for the notices of one app,
-- and returns the channel and this connection's server process (for
-- operators matching a watcher with pg_stat_activity, and for tests that
-- cut it). The tenant check comes first, as in every store function: a
-- refused role gets 42501 and listens to nothing. LISTEN takes effect when
-- the call commits. Refuses when the feed is off: a watcher would otherwise
-- wait for notices that never come.
CREATE FUNCTION adk_feed_listen(p_tenant text, p_app_name text)
RETURNS TABLE (channel text, backend_pid integer)
LANGUAGE plpgsql
SECURITY DEFINER
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

-- What a watcher reads: the session's header, then the events after
-- p_after_seq, oldest first, at most p_limit of them, all in one snapshot.
--
-- * No row: the session is missing, expired, or not the tenant's (a
--   refused read returns nothing, as adk_get_session does).
-- * The first row is the header (seq NULL): the session's last_seq (its
--   version), created_at (which tells a session from a later one created
--   with the same key after a delete), expires_at (so the watcher knows
--   when to look again), closed_at and successor_id.
-- * When p_after_seq > 0, the next row is the event at p_after_seq itself,
--   with its event_id and no payload: the watcher compares the id with the
--   one it delivered, so a rewind (and new events with reused seqs) under it
--   is told, not silently skipped. Its absence says the same.
-- * Then one row per event (seq, event_id, payload) after p_after_seq, up to
--   last_seq as the header reports it.
--
-- The events are read with session_day bound (one partition) through
-- EXECUTE, planned with its arguments on every call, as in adk_get_session;
-- the session row is read by primary key and keeps its cached plan.
CREATE FUNCTION adk_read_events_after(
    p_tenant     text,
    p_app_name   text,
    p_user_id    text,
    p_session_id text,
    p_after_seq  bigint,
    p_limit      integer
) RETURNS TABLE (
    last_seq     bigint,
    created_at   timestamptz,
    expires_at   timestamptz,
    closed_at    timestamptz,
    successor_id text,
    seq          bigint,
    event_id     text,
    payload      jsonb
)
LANGUAGE plpgsql
-- STABLE: the header and the events are one snapshot, so the events are
-- exactly those of the version the header reports.
STABLE
SECURITY DEFINER
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
    RETURN QUERY EXECUTE
        'SELECT NULL::bigint, NULL::timestamptz, NULL::timestamptz, NULL::timestamptz, NULL::text,
                e.seq, e.event_id, CASE WHEN e.seq > $5 THEN e.payload END
           FROM adk_events e
          WHERE e.app_name = $1 AND e.user_id = $2 AND e.session_id = $3 AND e.session_day = $4
            AND e.seq >= $5 AND e.seq <= $6
          ORDER BY e.seq
          LIMIT $7'
        USING p_app_name, p_user_id, p_session_id, s.session_day, p_after_seq, s.last_seq,
              p_limit::bigint + 1;
END;
$$;

-- As for every store function (migration 8): the PL/pgSQL ones resolve
-- names on a pinned path, the SQL-standard ones were bound at creation, and
-- none is callable by PUBLIC.
DO $$
DECLARE
    f      regprocedure;
    pinned boolean;
BEGIN
    FOR f, pinned IN SELECT p.oid::regprocedure, p.prosqlbody IS NULL FROM pg_catalog.pg_proc p
                     WHERE p.pronamespace = pg_catalog.current_schema()::regnamespace
                       AND p.proname IN ('adk_feed_channel', 'adk_feed_event_notify', 'adk_feed_session_notify',
                                         'adk_change_feed_enabled', 'adk_set_change_feed', 'adk_feed_listen',
                                         'adk_read_events_after') LOOP
        IF pinned THEN
            EXECUTE pg_catalog.format('ALTER FUNCTION %s SET search_path = pg_catalog, %I, pg_temp',
                                      f, pg_catalog.current_schema());
        END IF;
        EXECUTE pg_catalog.format('REVOKE EXECUTE ON FUNCTION %s FROM PUBLIC', f);
    END LOOP;
END;
$$;

-- Roles already bound to apps may watch without re-running their setup, as
-- migration 11 did for adk_get_session.
DO $$
DECLARE
    r regrole;
BEGIN
    FOR r IN SELECT DISTINCT b.role_oid::regrole FROM adk_role_apps b
              WHERE EXISTS (SELECT FROM pg_catalog.pg_roles x WHERE x.oid = b.role_oid) LOOP
        EXECUTE pg_catalog.format('GRANT EXECUTE ON FUNCTION adk_feed_listen(text, text) TO %s', r);
        EXECUTE pg_catalog.format(
            'GRANT EXECUTE ON FUNCTION adk_read_events_after(text, text, text, text, bigint, integer) TO %s', r);
    END LOOP;
END;
$$;

-- Off until the owner turns it on (adk-pg change-feed on): NOTIFY serializes
-- notifying commits through one cluster-wide lock held across their WAL
-- flush, which halved appends/s under 8 writers. A store nobody watches
-- must not pay that.
