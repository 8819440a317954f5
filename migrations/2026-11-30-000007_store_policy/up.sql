-- One policy, in the database: the session lifetime that appends enforce,
-- the retention maintenance keeps after it, the default TTL and the days
-- premade ahead all live in one row that the SQL functions and maintenance
-- read. A client's setting may only tighten it. Durations are read with a
-- day as 24 hours and a month as 30 days (adk_policy_seconds), so nothing
-- depends on the server's TimeZone. See README "Policy and maintenance".

CREATE TABLE adk_store_policy (
    id                   boolean     NOT NULL DEFAULT true,
    max_session_lifetime interval    NOT NULL DEFAULT '7 days',
    retention            interval    NOT NULL DEFAULT '30 days',
    default_ttl          interval,
    premake_days         integer     NOT NULL DEFAULT 7,
    updated_at           timestamptz NOT NULL DEFAULT now(),
    updated_by           text        NOT NULL DEFAULT current_user,
    CONSTRAINT adk_store_policy_pkey PRIMARY KEY (id),
    CONSTRAINT adk_store_policy_one_row CHECK (id),
    CONSTRAINT adk_store_policy_lifetime_positive CHECK (max_session_lifetime >= interval '1 second'),
    CONSTRAINT adk_store_policy_retention_covers_lifetime CHECK (retention >= max_session_lifetime),
    CONSTRAINT adk_store_policy_ttl_positive CHECK (default_ttl IS NULL OR default_ttl >= interval '1 second'),
    CONSTRAINT adk_store_policy_premake_days_range CHECK (premake_days BETWEEN 1 AND 366)
);
INSERT INTO adk_store_policy DEFAULT VALUES;

-- Every change of the policy, with its time and who made it, whether it came
-- through `adk-pg policy set`, the Rust API or a hand-written UPDATE.
CREATE TABLE adk_store_policy_changes (
    change_id  bigint      GENERATED ALWAYS AS IDENTITY,
    changed_at timestamptz NOT NULL DEFAULT now(),
    changed_by text        NOT NULL DEFAULT current_user,
    before     jsonb       NOT NULL,
    after      jsonb       NOT NULL,
    CONSTRAINT adk_store_policy_changes_pkey PRIMARY KEY (change_id)
);

CREATE FUNCTION adk_store_policy_guard() RETURNS trigger
LANGUAGE plpgsql
AS $$
BEGIN
    IF TG_OP = 'DELETE' THEN
        RAISE EXCEPTION 'the store policy row cannot be deleted; change it with adk-pg policy set'
            USING ERRCODE = 'restrict_violation';
    END IF;
    NEW.updated_at := now();
    NEW.updated_by := current_user;
    INSERT INTO adk_store_policy_changes (before, after)
    VALUES (to_jsonb(OLD) - 'id', to_jsonb(NEW) - 'id');
    RETURN NEW;
END;
$$;

CREATE TRIGGER adk_store_policy_guard BEFORE UPDATE OR DELETE ON adk_store_policy
    FOR EACH ROW EXECUTE FUNCTION adk_store_policy_guard();

-- An interval as an exact number of seconds (a day is 24 hours, a month 30
-- days, so a year 360), so `timestamptz + interval` never depends on
-- TimeZone or DST. extract(epoch) counts a year as 365.25 days; the
-- correction makes it agree with the Rust reading of the same row.
CREATE FUNCTION adk_policy_seconds(d interval) RETURNS interval
    LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
    RETURN make_interval(secs => extract(epoch FROM d) - extract(year FROM d) * 5.25 * 86400);

-- What maintenance did, or why it did not: failed runs are recorded too, and
-- days kept past their retention say which live sessions held them.
ALTER TABLE adk_maintenance_runs
    ADD COLUMN outcome   text  NOT NULL DEFAULT 'ok',
    ADD COLUMN error     text,
    ADD COLUMN kept_days jsonb NOT NULL DEFAULT '[]',
    ADD CONSTRAINT adk_maintenance_runs_outcome_known CHECK (outcome IN ('ok', 'failed'));

-- The session-scoped state a session was created (or rolled over) with:
-- rewinding replays event deltas on top of it. Never changed by an append,
-- so appends stay HOT. Sessions from before this migration start from {}.
ALTER TABLE adk_sessions
    ADD COLUMN initial_state jsonb NOT NULL DEFAULT '{}',
    ADD CONSTRAINT adk_sessions_initial_state_is_object CHECK (jsonb_typeof(initial_state) = 'object'),
    ADD CONSTRAINT adk_sessions_initial_state_size CHECK (pg_column_size(initial_state) < 65536);

-- Creates the event partitions for today (UTC) through today + the policy's
-- premake_days that are missing; returns how many it made. It runs as the
-- tables' owner so that a store connected as a non-owner service role is
-- never left without today's partition, and it takes no argument: a caller
-- can only make the days the policy asks for, never an arbitrary one.
CREATE FUNCTION adk_premake_event_partitions() RETURNS integer
LANGUAGE plpgsql
SECURITY DEFINER
SET lock_timeout = '5s'
AS $$
DECLARE
    today date := (now() AT TIME ZONE 'UTC')::date;
    ahead integer;
    made  integer := 0;
BEGIN
    SELECT p.premake_days INTO ahead FROM adk_store_policy p;
    FOR offset_days IN 0 .. coalesce(ahead, 7) LOOP
        IF adk_ensure_event_partition(today + offset_days) THEN
            made := made + 1;
        END IF;
    END LOOP;
    RETURN made;
END;
$$;
REVOKE EXECUTE ON FUNCTION adk_premake_event_partitions() FROM PUBLIC;

-- A SECURITY DEFINER function must not resolve names through a search_path
-- its caller controls: pin it to the catalog and the store's own schema.
DO $$
BEGIN
    EXECUTE format('ALTER FUNCTION adk_premake_event_partitions() SET search_path = pg_catalog, %I, pg_temp',
                   current_schema());
END;
$$;

-- Creating a session whose id belongs to an expired, not yet purged session
-- replaces it atomically (its events go with it by the cascade), so an
-- expired id is free at once. The TTL is the shorter of the caller's and the
-- policy's default. The initial state is kept for rewind.
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
    ttl   interval;
    u     jsonb;
    a     jsonb;
BEGIN
    PERFORM adk_enter_tenant(p_tenant);
    DELETE FROM adk_sessions x
     WHERE x.app_name = p_app_name AND x.user_id = p_user_id AND x.session_id = p_session_id
       AND x.expires_at <= now();
    SELECT least(adk_policy_seconds(p_ttl), adk_policy_seconds(p.default_ttl)) INTO ttl FROM adk_store_policy p;
    INSERT INTO adk_sessions (app_name, user_id, session_id, state, initial_state, expires_at)
    VALUES (p_app_name, p_user_id, p_session_id, p_state, p_state, now() + ttl)
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

-- The append now holds every session to the policy's lifetime (or the
-- caller's shorter one) and reports the lifetime it applied; a plain stored
-- append no longer sends the payload back (the caller has it).
DROP FUNCTION adk_append_event(text, text, text, text, text, text, text, bigint, jsonb, jsonb, jsonb, jsonb, bigint,
                               interval);

-- The append path in one statement, so an append costs one round trip: lock
-- the session row, replay an idempotent retry, check closure, lifetime and
-- version, take the next seq, insert the event, merge the session delta and
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
--   too_old    the session is older than `max_lifetime`: the policy's
--              lifetime, or `p_max_lifetime` when that is shorter
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
    successor_id text,
    max_lifetime interval
)
LANGUAGE plpgsql
SET plan_cache_mode = force_custom_plan
AS $$
#variable_conflict use_column
DECLARE
    s          record;
    prior      record;
    lifetime   interval;
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
    IF lifetime IS NOT NULL AND s.created_at + lifetime <= now() THEN
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

    RETURN QUERY SELECT 'stored'::text, next_seq, s.session_day, new_update, NULL::jsonb, NULL::text,
                        NULL::interval;
END;
$$;

-- Closes a session and opens its successor in one statement: the successor
-- gets the closed session's session-scoped state (also as its initial
-- state, which rewind starts from), today's UTC session day, the caller's
-- summary as its first event and the shorter of the caller's and the
-- policy's TTL.
--
-- Outcomes: rolled (also when a retry finds the rollover it asked for
-- already done: the session is closed with this very successor), not_found,
-- closed (rolled over to another successor, named in successor_id), exists
-- (the successor id is taken). A missing partition for today raises
-- PostgreSQL's "no partition of relation" error and nothing is written.
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
    ttl  interval;
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
        RETURN QUERY SELECT CASE WHEN old.successor_id = p_successor_id THEN 'rolled' ELSE 'closed' END,
                            NULL::jsonb, NULL::timestamptz, NULL::timestamptz, NULL::timestamptz,
                            old.successor_id;
        RETURN;
    END IF;

    SELECT least(adk_policy_seconds(p_ttl), adk_policy_seconds(p.default_ttl)) INTO ttl FROM adk_store_policy p;
    INSERT INTO adk_sessions (app_name, user_id, session_id, state, initial_state, last_seq, expires_at)
    VALUES (p_app_name, p_user_id, p_successor_id, old.state, old.state, 1, now() + ttl)
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

-- Keeps the first p_keep events of a session and forgets the rest: deletes
-- the later events (from the session's one partition), rebuilds the
-- session-scoped state as the initial state plus the kept events' deltas in
-- order, and sets the version back. App and user state are shared with
-- other sessions and stay. Rewinding to the current version changes
-- nothing and succeeds, so a retry whose first reply was lost succeeds too.
--
-- Outcomes: rewound, not_found, stale (p_expected_seq differs from
-- last_seq, returned in `seq`), beyond (p_keep is past the last event).
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
    SELECT a.last_seq, a.session_day, a.expires_at, a.initial_state INTO s
      FROM adk_sessions a
     WHERE a.app_name = p_app_name AND a.user_id = p_user_id AND a.session_id = p_session_id
       FOR NO KEY UPDATE;
    IF NOT FOUND OR (s.expires_at IS NOT NULL AND s.expires_at <= now()) THEN
        RETURN QUERY SELECT 'not_found'::text, NULL::bigint;
        RETURN;
    END IF;
    IF p_keep = s.last_seq THEN
        RETURN QUERY SELECT 'rewound'::text, p_keep;
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
       SET last_seq = p_keep, state = s.initial_state || folded, updated_at = greatest(now(), a.updated_at)
     WHERE a.app_name = p_app_name AND a.user_id = p_user_id AND a.session_id = p_session_id;
    RETURN QUERY SELECT 'rewound'::text, p_keep;
END;
$$;
