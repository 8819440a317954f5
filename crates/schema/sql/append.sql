-- The append: one event stored, the session moved on, and the state
-- deltas merged, in one statement on the common path.
--
-- Installed after every migrate, in one transaction with the other files
-- (crates/schema/src/replaceable.rs). Each function is stated whole, with
-- its SET clauses and grants: change it here, not in a migration.

-- A leaner append: the same outcomes, in one statement on the common path.
--
-- Migration 8's append ran up to seven statements per call (the tenant check
-- in a function of its own, the locking read, the replay lookup, the policy
-- read, the insert, the update, the result), each planned afresh on every
-- call under `plan_cache_mode = force_custom_plan`, and switched two GUCs in
-- and out around it. Now:
--
-- * One statement locks the session row, checks in its WHERE everything
--   that lets an append through (live, open, young enough for the policy,
--   expected seq), inserts the event and moves the session on. The insert
--   skips an event id the session already holds (ON CONFLICT DO NOTHING on
--   the event id key), and the update runs only on the row the insert
--   returned, so a retried event changes nothing.
-- * Only when that statement stored nothing does the function find out why,
--   in migration 8's order (not found, replayed or duplicate, closed, too
--   old, stale); if it finds no reason (the session changed in between), it
--   stores the event as migration 8 did, under the row lock.
-- * The common path no longer reads adk_events at all: the insert routes its
--   row and probes the event id index, and nothing in it is chosen from the
--   partition's statistics. The replay lookup, the one read of a partition,
--   runs only on the rare path and through EXECUTE, planned with its
--   arguments every time. So `plan_cache_mode = force_custom_plan` has
--   nothing left to protect here and is dropped: the plans are cached. (The
--   session row is reached by its primary key, as in every other function of
--   the store that runs on cached plans.)
-- Locks are taken in the same order as before: the statement's relations
-- are locked in the order of its WITH list, the session row lock (ROW SHARE
-- on adk_sessions) before the event insert (ROW EXCLUSIVE on adk_events)
-- before the session update (ROW EXCLUSIVE on adk_sessions), so an append
-- never holds a lock on adk_sessions that a partition being created (ACCESS
-- EXCLUSIVE on adk_events, then SHARE ROW EXCLUSIVE on adk_sessions) waits
-- for while it waits for adk_events itself.
--
-- On Citus the common path is three statements instead (the branch under
-- adk_on_citus(), defined in sessions.sql); what follows it, the rare path,
-- the shared-state deltas and the result, is the same on both.
CREATE OR REPLACE FUNCTION adk_append_event(p_tenant text, p_app_name text, p_user_id text, p_session_id text, p_event_id text, p_invocation_id text, p_author text, p_event_ts bigint, p_payload jsonb, p_session_delta jsonb, p_user_delta jsonb, p_app_delta jsonb, p_expected_seq bigint, p_max_lifetime interval, p_blobs bytea[] DEFAULT NULL, p_lease_idle interval DEFAULT NULL, p_lease_generation bigint DEFAULT NULL, p_lease_release boolean DEFAULT false)
 RETURNS TABLE(outcome text, seq bigint, session_day date, updated_at timestamp with time zone, payload jsonb, successor_id text, max_lifetime interval, lease_holder text, lease_until timestamp with time zone, lease_generation bigint)
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path = pg_catalog, :"store_schema", pg_temp
AS $function$
#variable_conflict use_column
DECLARE
    s             record;
    prior_seq     bigint;
    prior_payload jsonb;
    lifetime      interval;
    next_seq      bigint;
    new_day       date;
    new_update    timestamptz;
    locked_day    date;
    locked_seq    bigint;
    locked_holder text;
    locked_gen    bigint;
    new_gen       bigint;
    new_until     timestamptz;
    locked_until  timestamptz;
    -- The lease after this append, worked out here rather than in the
    -- UPDATE: Citus refuses now() inside a CASE of a statement it routes.
    next_holder   text;
    next_until    timestamptz;
    -- The event's media (blobs.sql): NULL for an event without any, which
    -- then takes no step of its own.
    hashes        bytea[] := CASE WHEN p_blobs IS NOT NULL THEN adk_blob_hashes(p_blobs) END;
BEGIN
    IF NOT adk_tenant_allows(p_tenant, p_app_name) THEN
        PERFORM adk_tenant_require(p_tenant, p_app_name);
    END IF;
    -- A lease is held by an invocation for a while: without either there
    -- is nothing to hold it by.
    IF p_lease_idle IS NOT NULL AND (p_invocation_id IS NULL OR p_lease_idle <= interval '0') THEN
        RAISE EXCEPTION 'an append under an invocation lease needs an invocation id and a positive idle lapse'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    -- Blobs are shared by the users of an app, and Citus places each user's
    -- rows on one node: storing them would write another node on every
    -- append with media. Refused before anything is written.
    IF hashes IS NOT NULL AND adk_on_citus() THEN
        RAISE EXCEPTION 'an event''s media cannot be stored apart from it on Citus'
            USING ERRCODE = 'feature_not_supported',
                  HINT = 'keep media out of events on Citus (artifacts), or run the store on one server';
    END IF;

    IF NOT adk_on_citus() THEN
        -- The common path: lock, check, insert, sequence, in one statement.
        -- (adk_on_citus() is folded to a constant when the condition is
        -- planned, so one server plans and runs nothing of the other branch.)
        WITH l AS (
            SELECT a.session_day, a.last_seq, a.lease_holder, a.lease_generation
              FROM adk_sessions a
             WHERE a.app_name = p_app_name AND a.user_id = p_user_id AND a.session_id = p_session_id
               AND (a.expires_at IS NULL OR a.expires_at > pg_catalog.now())
               AND a.closed_at IS NULL
               AND coalesce(a.created_at + coalesce(
                       (SELECT least(adk_policy_seconds(p.max_session_lifetime), adk_policy_seconds(p_max_lifetime))
                          FROM adk_store_policy p),
                       adk_policy_seconds(p_max_lifetime)) > pg_catalog.now(), true)
               AND (p_expected_seq IS NULL OR a.last_seq = p_expected_seq)
               -- The invocation lease (crates/domain/src/lease.rs): no other
               -- invocation holds it live, and the caller's fencing token,
               -- when it has one, is still the session's generation.
               AND (p_lease_idle IS NULL
                    OR ((a.lease_holder IS NULL OR a.lease_holder = p_invocation_id
                         OR a.lease_until <= pg_catalog.now())
                        AND (p_lease_generation IS NULL OR a.lease_generation = p_lease_generation)))
               FOR NO KEY UPDATE OF a
        ), e AS (
            INSERT INTO adk_events AS ev (app_name, user_id, session_id, session_day, seq, event_id,
                                          invocation_id, author, event_ts, payload, blob_refs)
            SELECT p_app_name, p_user_id, p_session_id, l.session_day, l.last_seq + 1, p_event_id,
                   p_invocation_id, p_author, p_event_ts, p_payload, hashes
              FROM l
            ON CONFLICT (app_name, user_id, session_id, session_day, event_id) DO NOTHING
            RETURNING ev.seq
        ), u AS (
            -- now() is the transaction start; a writer that waited for the lock
            -- may have started before the one it waited for, so never step
            -- backwards. The state is merged only when the delta has keys.
            -- The lease moves with the event (adk_lease_* below): a new
            -- generation when another invocation takes it, none when the
            -- lease is off for this append.
            UPDATE adk_sessions a
               SET last_seq = e.seq,
                   updated_at = greatest(pg_catalog.now(), a.updated_at),
                   state = CASE WHEN p_session_delta IS NOT NULL AND p_session_delta <> '{}'::jsonb
                                THEN a.state || p_session_delta ELSE a.state END,
                   lease_holder = CASE WHEN p_lease_idle IS NULL THEN a.lease_holder
                                       WHEN p_lease_release THEN NULL ELSE p_invocation_id END,
                   lease_generation = CASE WHEN p_lease_idle IS NULL OR p_lease_generation IS NOT NULL
                                                OR l.lease_holder = p_invocation_id
                                           THEN l.lease_generation ELSE l.lease_generation + 1 END,
                   lease_until = CASE WHEN p_lease_idle IS NULL THEN a.lease_until
                                      WHEN p_lease_release THEN NULL ELSE pg_catalog.now() + p_lease_idle END
              FROM e, l
             WHERE a.app_name = p_app_name AND a.user_id = p_user_id AND a.session_id = p_session_id
            RETURNING a.last_seq, a.session_day, a.updated_at, a.lease_generation, a.lease_until
        )
        SELECT u.last_seq, u.session_day, u.updated_at, u.lease_generation, u.lease_until
          INTO next_seq, new_day, new_update, new_gen, new_until FROM u;
    ELSE
        -- The common path on Citus, with the same checks and outcomes as
        -- three statements: the locking read with every check in its WHERE,
        -- the insert of the event (ON CONFLICT DO NOTHING on its event id),
        -- and the update of the session, run only when the insert stored a
        -- row (its SET as the CTE's). Citus plans a CTE that inserts through
        -- intermediate results sent to every node, a two-phase commit across
        -- all of them on every append; each of these statements it routes to
        -- the user's worker. One server keeps the CTE, a quarter more appends
        -- there (migration 10). Locks are taken in the same order as there:
        -- the session row, then the event, then the session update.
        SELECT a.session_day, a.last_seq, a.lease_holder, a.lease_generation, a.lease_until
          INTO locked_day, locked_seq, locked_holder, locked_gen, locked_until
          FROM adk_sessions a
         WHERE a.app_name = p_app_name AND a.user_id = p_user_id AND a.session_id = p_session_id
           AND (a.expires_at IS NULL OR a.expires_at > pg_catalog.now())
           AND a.closed_at IS NULL
           AND coalesce(a.created_at + coalesce(
                   (SELECT least(adk_policy_seconds(p.max_session_lifetime), adk_policy_seconds(p_max_lifetime))
                      FROM adk_store_policy p),
                   adk_policy_seconds(p_max_lifetime)) > pg_catalog.now(), true)
           AND (p_expected_seq IS NULL OR a.last_seq = p_expected_seq)
           AND (p_lease_idle IS NULL
                OR ((a.lease_holder IS NULL OR a.lease_holder = p_invocation_id
                     OR a.lease_until <= pg_catalog.now())
                    AND (p_lease_generation IS NULL OR a.lease_generation = p_lease_generation)))
           FOR NO KEY UPDATE OF a;
        IF FOUND THEN
            INSERT INTO adk_events AS ev (app_name, user_id, session_id, session_day, seq, event_id,
                                          invocation_id, author, event_ts, payload, blob_refs)
            VALUES (p_app_name, p_user_id, p_session_id, locked_day, locked_seq + 1, p_event_id,
                    p_invocation_id, p_author, p_event_ts, p_payload, hashes)
            ON CONFLICT (app_name, user_id, session_id, session_day, event_id) DO NOTHING
            RETURNING ev.seq INTO next_seq;
            IF next_seq IS NOT NULL THEN
                next_holder := CASE WHEN p_lease_idle IS NULL THEN locked_holder
                                    WHEN p_lease_release THEN NULL ELSE p_invocation_id END;
                next_until := CASE WHEN p_lease_idle IS NULL THEN locked_until
                                   WHEN p_lease_release THEN NULL ELSE pg_catalog.now() + p_lease_idle END;
                UPDATE adk_sessions a
                   SET last_seq = next_seq,
                       updated_at = greatest(pg_catalog.now(), a.updated_at),
                       state = CASE WHEN p_session_delta IS NOT NULL AND p_session_delta <> '{}'::jsonb
                                    THEN a.state || p_session_delta ELSE a.state END,
                       lease_holder = next_holder,
                       lease_generation = CASE WHEN p_lease_idle IS NULL OR p_lease_generation IS NOT NULL
                                                    OR locked_holder = p_invocation_id
                                               THEN locked_gen ELSE locked_gen + 1 END,
                       lease_until = next_until
                 WHERE a.app_name = p_app_name AND a.user_id = p_user_id AND a.session_id = p_session_id
                RETURNING a.session_day, a.updated_at, a.lease_generation, a.lease_until
                     INTO new_day, new_update, new_gen, new_until;
            END IF;
        END IF;
    END IF;

    IF next_seq IS NULL THEN
        -- Nothing stored: find out why, in migration 8's order.
        SELECT a.last_seq, a.session_day, a.created_at, a.updated_at, a.expires_at,
               a.closed_at, a.successor_id, a.lease_holder, a.lease_generation, a.lease_until
          INTO s
          FROM adk_sessions a
         WHERE a.app_name = p_app_name AND a.user_id = p_user_id AND a.session_id = p_session_id
           FOR NO KEY UPDATE;

        IF NOT FOUND OR (s.expires_at IS NOT NULL AND s.expires_at <= pg_catalog.now()) THEN
            RETURN QUERY SELECT 'not_found'::text, NULL::bigint, NULL::date, NULL::timestamptz,
                                NULL::jsonb, NULL::text, NULL::interval, NULL::text, NULL::timestamptz, NULL::bigint;
            RETURN;
        END IF;

        -- A retry of an append that already succeeded: answer with what is
        -- stored. Planned with its arguments on every call (EXECUTE), so no
        -- plan made while the partition was small outlives its growth.
        EXECUTE 'SELECT e.seq, e.payload FROM adk_events e
                  WHERE e.app_name = $1 AND e.user_id = $2 AND e.session_id = $3
                    AND e.session_day = $4 AND e.event_id = $5'
           INTO prior_seq, prior_payload
          USING p_app_name, p_user_id, p_session_id, s.session_day, p_event_id;
        IF prior_seq IS NOT NULL THEN
            RETURN QUERY SELECT CASE WHEN prior_payload = p_payload THEN 'replayed' ELSE 'duplicate' END,
                                prior_seq, s.session_day, s.updated_at, prior_payload, NULL::text, NULL::interval,
                                NULL::text, NULL::timestamptz, NULL::bigint;
            RETURN;
        END IF;

        IF s.closed_at IS NOT NULL THEN
            RETURN QUERY SELECT 'closed'::text, s.last_seq, s.session_day, s.updated_at, NULL::jsonb,
                                s.successor_id, NULL::interval, NULL::text, NULL::timestamptz, NULL::bigint;
            RETURN;
        END IF;
        SELECT least(adk_policy_seconds(p.max_session_lifetime), adk_policy_seconds(p_max_lifetime))
          INTO lifetime FROM adk_store_policy p;
        lifetime := coalesce(lifetime, adk_policy_seconds(p_max_lifetime));
        IF lifetime IS NOT NULL AND s.created_at + lifetime <= pg_catalog.now() THEN
            RETURN QUERY SELECT 'too_old'::text, s.last_seq, s.session_day, s.updated_at, NULL::jsonb,
                                NULL::text, lifetime, NULL::text, NULL::timestamptz, NULL::bigint;
            RETURN;
        END IF;
        -- The lease, as the common path checks it: another invocation's live
        -- lease makes the session busy; a fencing token the session moved
        -- past means this invocation was taken over.
        IF p_lease_idle IS NOT NULL THEN
            IF s.lease_holder IS NOT NULL AND s.lease_holder <> p_invocation_id
               AND s.lease_until > pg_catalog.now() THEN
                RETURN QUERY SELECT 'busy'::text, s.last_seq, s.session_day, s.updated_at, NULL::jsonb,
                                    NULL::text, NULL::interval, s.lease_holder, s.lease_until, s.lease_generation;
                RETURN;
            END IF;
            IF p_lease_generation IS NOT NULL AND p_lease_generation <> s.lease_generation THEN
                RETURN QUERY SELECT 'lease_lost'::text, s.last_seq, s.session_day, s.updated_at, NULL::jsonb,
                                    NULL::text, NULL::interval, s.lease_holder, s.lease_until, s.lease_generation;
                RETURN;
            END IF;
        END IF;
        IF p_expected_seq IS NOT NULL AND p_expected_seq <> s.last_seq THEN
            RETURN QUERY SELECT 'stale'::text, s.last_seq, s.session_day, s.updated_at, NULL::jsonb,
                                NULL::text, NULL::interval, NULL::text, NULL::timestamptz, NULL::bigint;
            RETURN;
        END IF;

        -- No reason: the session changed between the two statements. Store
        -- the event as migration 8 did, under the row lock taken above.
        next_seq := s.last_seq + 1;
        new_day := s.session_day;
        new_update := greatest(pg_catalog.now(), s.updated_at);
        next_holder := CASE WHEN p_lease_idle IS NULL THEN s.lease_holder
                            WHEN p_lease_release THEN NULL ELSE p_invocation_id END;
        next_until := CASE WHEN p_lease_idle IS NULL THEN s.lease_until
                           WHEN p_lease_release THEN NULL ELSE pg_catalog.now() + p_lease_idle END;
        INSERT INTO adk_events (app_name, user_id, session_id, session_day, seq, event_id,
                                invocation_id, author, event_ts, payload, blob_refs)
        VALUES (p_app_name, p_user_id, p_session_id, s.session_day, next_seq, p_event_id,
                p_invocation_id, p_author, p_event_ts, p_payload, hashes);
        UPDATE adk_sessions a
           SET last_seq = next_seq, updated_at = new_update,
               state = CASE WHEN p_session_delta IS NOT NULL AND p_session_delta <> '{}'::jsonb
                            THEN a.state || p_session_delta ELSE a.state END,
               lease_holder = next_holder,
               lease_generation = CASE WHEN p_lease_idle IS NULL OR p_lease_generation IS NOT NULL
                                            OR s.lease_holder = p_invocation_id
                                       THEN s.lease_generation ELSE s.lease_generation + 1 END,
               lease_until = next_until
         WHERE a.app_name = p_app_name AND a.user_id = p_user_id AND a.session_id = p_session_id
        RETURNING a.lease_generation, a.lease_until INTO new_gen, new_until;
    END IF;

    -- Stored: the event holds its media now, so the blobs can be counted.
    IF hashes IS NOT NULL THEN
        PERFORM adk_hold_blobs(p_app_name, hashes, p_blobs);
    END IF;

    IF p_user_delta IS NOT NULL AND p_user_delta <> '{}'::jsonb THEN
        INSERT INTO adk_user_states AS u (app_name, user_id, state)
        VALUES (p_app_name, p_user_id, p_user_delta)
        ON CONFLICT (app_name, user_id)
        DO UPDATE SET state = u.state || EXCLUDED.state, updated_at = EXCLUDED.updated_at;
    END IF;
    IF p_app_delta IS NOT NULL AND p_app_delta <> '{}'::jsonb THEN
        INSERT INTO adk_app_states AS a (app_name, state)
        VALUES (p_app_name, p_app_delta)
        ON CONFLICT (app_name)
        DO UPDATE SET state = a.state || EXCLUDED.state, updated_at = EXCLUDED.updated_at;
    END IF;

    outcome := 'stored';
    seq := next_seq;
    session_day := new_day;
    updated_at := new_update;
    payload := NULL;
    successor_id := NULL;
    max_lifetime := NULL;
    lease_holder := CASE WHEN new_until IS NOT NULL THEN p_invocation_id END;
    lease_until := new_until;
    lease_generation := CASE WHEN p_lease_idle IS NOT NULL THEN new_gen END;
    RETURN NEXT;
END;
$function$;
REVOKE EXECUTE ON FUNCTION adk_append_event(p_tenant text, p_app_name text, p_user_id text, p_session_id text, p_event_id text, p_invocation_id text, p_author text, p_event_ts bigint, p_payload jsonb, p_session_delta jsonb, p_user_delta jsonb, p_app_delta jsonb, p_expected_seq bigint, p_max_lifetime interval, p_blobs bytea[], p_lease_idle interval, p_lease_generation bigint, p_lease_release boolean) FROM PUBLIC;

-- The append gained its lease arguments in migration 29, which dropped the
-- fifteen-argument one and its grants with it: the roles that may read the
-- store's sessions may append to them again.
SELECT adk_grant_like('adk_append_event(text, text, text, text, text, text, text, bigint, jsonb, jsonb, jsonb, jsonb, bigint, interval, bytea[], interval, bigint, boolean)', 'adk_get_session(text, text, text, text, bigint, bigint)');
