-- A session's life outside the append: create, find, metadata (titles and
-- labels, checked by a trigger), rollover at the lifetime cap, rewind,
-- fork and delete.
--
-- Installed after every migrate, in one transaction with the other files
-- (crates/schema/src/replaceable.rs). Each function is stated whole, with
-- its SET clauses and grants: change it here, not in a migration.

-- Whether the store runs on Citus: false here, true on a database with the
-- citus extension, where sessions.citus.sql, installed right after this
-- file, replaces it. Where Citus needs other statements than one server
-- (the common paths of the create below and of the append, append.sql), the
-- one body branches on it. It is defined here, before its first user.
--
-- IMMUTABLE, so the planner calls it once, when it plans the branch's
-- condition, and keeps the constant it returned (EXPLAIN shows `Output:
-- true`): one server runs its common path as before, with nothing of the
-- other branch planned or run. PostgreSQL records the function as a
-- dependency of each plan that folded it, so replacing it replans them on
-- every connection; tests/tests/store/function_statements.rs checks that a
-- live connection takes the other branch on its next call.
CREATE OR REPLACE FUNCTION adk_on_citus() RETURNS boolean
 LANGUAGE sql IMMUTABLE PARALLEL SAFE
 SET search_path = pg_catalog, :"store_schema", pg_temp
AS $$ SELECT false $$;
REVOKE EXECUTE ON FUNCTION adk_on_citus() FROM PUBLIC;

-- The create's common path as one statement, as the append's is (migration
-- 10): the insert takes its expiry from the policy and returns the live
-- user and app state in the same statement.
--
-- The body before ran six statements on every create: a delete of an
-- expired session holding the id, the policy read, the insert, and a read
-- (or an upsert) of each shared state. Through pgbench on one server,
-- medians of nine interleaved rounds of 2,000 creates: 1,603/s before,
-- 2,012/s with one statement, 2,292/s for a bare insert. An expired
-- session holding the id is now looked for only when the insert found the
-- id taken; that path, and the rare create that carries initial user or
-- app state, run the statements of the body before, written out after the
-- common path (a retry loop around one insert cost most of the gain).
--
-- Citus rejects any subquery in an INSERT, so there (adk_on_citus(),
-- above) every create takes the rare path, whose policy read is a
-- statement of its own for that reason.
CREATE OR REPLACE FUNCTION adk_create_session(p_tenant text, p_app_name text, p_user_id text, p_session_id text, p_state jsonb, p_ttl interval, p_user_delta jsonb, p_app_delta jsonb, p_display_name text DEFAULT NULL::text, p_labels jsonb DEFAULT '{}'::jsonb)
 RETURNS TABLE(created_at timestamp with time zone, updated_at timestamp with time zone, expires_at timestamp with time zone, user_state jsonb, app_state jsonb)
 LANGUAGE plpgsql
 SECURITY DEFINER
SET search_path = pg_catalog, :"store_schema", pg_temp
AS $$
#variable_conflict use_column
DECLARE
    ttl interval;
BEGIN
    IF NOT adk_tenant_allows(p_tenant, p_app_name) THEN
        PERFORM adk_tenant_require(p_tenant, p_app_name);
    END IF;
    IF NOT adk_on_citus() AND p_user_delta = '{}'::jsonb AND p_app_delta = '{}'::jsonb THEN
        INSERT INTO adk_sessions AS s (app_name, user_id, session_id, state, initial_state, expires_at, display_name, labels)
        VALUES (p_app_name, p_user_id, p_session_id, p_state, p_state,
                pg_catalog.now() + (SELECT least(adk_policy_seconds(p_ttl), adk_policy_seconds(p.default_ttl))
                                      FROM adk_store_policy p),
                p_display_name, coalesce(p_labels, '{}'::jsonb))
        ON CONFLICT DO NOTHING
        RETURNING s.created_at, s.updated_at, s.expires_at,
                  (SELECT us.state FROM adk_user_states us WHERE us.app_name = p_app_name AND us.user_id = p_user_id),
                  (SELECT aps.state FROM adk_app_states aps WHERE aps.app_name = p_app_name)
        INTO created_at, updated_at, expires_at, user_state, app_state;
        IF FOUND THEN
            RETURN NEXT;
            RETURN;
        END IF;
    END IF;
    -- The rare path: the id was taken, or the create carries initial user
    -- or app state; on Citus, every create. An expired session holding the
    -- id is replaced: deleted in this transaction, so the insert no longer
    -- sees it. Citus rejects any subquery in an INSERT, so the policy's TTL
    -- is read by a statement of its own, which takes no argument: planned
    -- once per connection (with p_ttl in it, the plan cache planned it
    -- again on every call, some 40 us, estimating hundreds of rows for the
    -- one the policy has).
    DELETE FROM adk_sessions x
     WHERE x.app_name = p_app_name AND x.user_id = p_user_id AND x.session_id = p_session_id
       AND x.expires_at <= pg_catalog.now();
    SELECT adk_policy_seconds(p.default_ttl) INTO ttl FROM adk_store_policy p;
    INSERT INTO adk_sessions AS s (app_name, user_id, session_id, state, initial_state, expires_at, display_name, labels)
    VALUES (p_app_name, p_user_id, p_session_id, p_state, p_state,
            pg_catalog.now() + least(adk_policy_seconds(p_ttl), ttl),
            p_display_name, coalesce(p_labels, '{}'::jsonb))
    ON CONFLICT DO NOTHING
    RETURNING s.created_at, s.updated_at, s.expires_at INTO created_at, updated_at, expires_at;
    IF NOT FOUND THEN
        -- A live session has the id.
        RETURN;
    END IF;
    IF p_user_delta <> '{}'::jsonb THEN
        INSERT INTO adk_user_states AS us (app_name, user_id, state)
        VALUES (p_app_name, p_user_id, p_user_delta)
        ON CONFLICT (app_name, user_id) DO UPDATE SET state = us.state || EXCLUDED.state, updated_at = EXCLUDED.updated_at
        RETURNING us.state INTO user_state;
    ELSE
        SELECT us.state INTO user_state FROM adk_user_states us WHERE us.app_name = p_app_name AND us.user_id = p_user_id;
    END IF;
    IF p_app_delta <> '{}'::jsonb THEN
        INSERT INTO adk_app_states AS aps (app_name, state)
        VALUES (p_app_name, p_app_delta)
        ON CONFLICT (app_name) DO UPDATE SET state = aps.state || EXCLUDED.state, updated_at = EXCLUDED.updated_at
        RETURNING aps.state INTO app_state;
    ELSE
        SELECT aps.state INTO app_state FROM adk_app_states aps WHERE aps.app_name = p_app_name;
    END IF;
    RETURN NEXT;
END;
$$;
REVOKE EXECUTE ON FUNCTION adk_create_session(p_tenant text, p_app_name text, p_user_id text, p_session_id text, p_state jsonb, p_ttl interval, p_user_delta jsonb, p_app_delta jsonb, p_display_name text, p_labels jsonb) FROM PUBLIC;

CREATE OR REPLACE FUNCTION adk_find_sessions(p_tenant text, p_session_id text, p_limit integer)
RETURNS TABLE (app_name text, user_id text)
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, :"store_schema", pg_temp
AS $$
#variable_conflict use_column
DECLARE
    acting     oid := adk_acting_role();
    everywhere boolean;
BEGIN
    IF p_tenant IS NOT NULL THEN
        IF NOT adk_tenant_allows(p_tenant, p_tenant) THEN
            RETURN;
        END IF;
        everywhere := false;
    ELSE
        -- No tenant named (a per-request store does not know the app yet):
        -- the owner looks everywhere, any other role in the apps it is
        -- bound to.
        everywhere := coalesce(pg_catalog.pg_has_role(acting, current_user, 'MEMBER'), false)
                      OR EXISTS (SELECT 1 FROM adk_role_apps b WHERE b.role_oid = acting AND b.app_name IS NULL);
    END IF;
    RETURN QUERY
    SELECT s.app_name, s.user_id FROM adk_sessions s
    WHERE s.session_id = p_session_id AND (s.expires_at IS NULL OR s.expires_at > pg_catalog.now())
      AND (p_tenant IS NULL OR s.app_name = p_tenant)
      AND (p_tenant IS NOT NULL OR everywhere
           OR s.app_name IN (SELECT b.app_name FROM adk_role_apps b WHERE b.role_oid = acting))
    ORDER BY s.app_name, s.user_id
    LIMIT p_limit;
END;
$$;
REVOKE EXECUTE ON FUNCTION adk_find_sessions(p_tenant text, p_session_id text, p_limit integer) FROM PUBLIC;

-- Replaces a session's display name and labels, and nothing else: not
-- last_seq, not updated_at (it is not an append), and a closed session may
-- still be renamed. A missing or expired session, or one of another user,
-- is 'not_found'. A write, so a role that may not act for the app is
-- refused with 42501 and nothing is written. The row lock is the append's
-- (FOR NO KEY UPDATE: labels are in no unique index), so a concurrent
-- append waits for it, or it for the append, and neither loses the other's
-- columns.
CREATE OR REPLACE FUNCTION adk_set_session_metadata(
    p_tenant       text,
    p_app_name     text,
    p_user_id      text,
    p_session_id   text,
    p_display_name text,
    p_labels       jsonb
) RETURNS TABLE (outcome text)
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, :"store_schema", pg_temp
AS $$
#variable_conflict use_column
BEGIN
    IF NOT adk_tenant_allows(p_tenant, p_app_name) THEN
        PERFORM adk_tenant_require(p_tenant, p_app_name);
    END IF;
    UPDATE adk_sessions a
       SET display_name = p_display_name, labels = coalesce(p_labels, '{}'::jsonb)
     WHERE a.app_name = p_app_name AND a.user_id = p_user_id AND a.session_id = p_session_id
       AND (a.expires_at IS NULL OR a.expires_at > pg_catalog.now());
    RETURN QUERY SELECT CASE WHEN FOUND THEN 'set' ELSE 'not_found' END;
END;
$$;
REVOKE EXECUTE ON FUNCTION adk_set_session_metadata(p_tenant text, p_app_name text, p_user_id text, p_session_id text, p_display_name text, p_labels jsonb) FROM PUBLIC;

-- The bounds of crates/domain/src/metadata.rs, as the last line of defence
-- against rows written behind the store's back (the store checks them
-- first and names the field). A display name: 1 to 256 characters, no
-- control character (Unicode Cc, as Rust's char::is_control), not only
-- whitespace (Rust's char::is_whitespace, less the controls). Labels: an
-- object of at most 32 string values; keys of 1 to 63 bytes, lowercase
-- ASCII letters, digits, '_', '-', '.' and '/', starting with a letter or a
-- digit; values of at most 256 characters, no control character.
--
-- A trigger, not CHECK constraints: PostgreSQL evaluates every CHECK of a
-- table on every UPDATE of a row, whichever columns it sets, so each append
-- would pay for them. Measured on PostgreSQL 15 (3,000 single-row updates
-- as an append makes them, each its own transaction): the same bounds as
-- CHECKs (jsonpath) added 22 us to every update of a session without
-- metadata (the constraints are prepared again for every statement), 44 us
-- with a name and four labels, and 2.4 ms with 32 labels of 256
-- characters, to an update that costs 29 us. The trigger fires only on an
-- INSERT or an UPDATE that sets display_name or labels (UPDATE OF), which no
-- append does, and only when there is metadata to check (WHEN): appends cost
-- what they cost without it, and a write of a name and four labels pays
-- some 30 to 50 us for the check. It runs as the writer. It refuses
-- a row as a CHECK would: SQLSTATE 23514 (check_violation), naming the
-- constraint, so clients and the store's error classifier cannot tell the
-- difference. The names: adk_sessions_display_name_sane,
-- adk_sessions_labels_is_object, adk_sessions_labels_sane.
CREATE OR REPLACE FUNCTION adk_session_metadata_check() RETURNS trigger
LANGUAGE plpgsql
SET search_path = pg_catalog, :"store_schema", pg_temp
AS $$
DECLARE
    label       record;
    labels_seen integer := 0;
    rule        text;
BEGIN
    IF NEW.display_name IS NOT NULL THEN
        rule := CASE
            WHEN pg_catalog.char_length(NEW.display_name) > 256 THEN 'is longer than 256 characters'
            WHEN NEW.display_name ~ '[\u0001-\u001f\u007f-\u009f]' THEN 'contains a control character'
            WHEN NEW.display_name !~ '[^ \u00a0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000]'
                THEN 'is empty or only whitespace'
        END;
        IF rule IS NOT NULL THEN
            RAISE EXCEPTION 'new row for relation "%" violates check constraint "%"',
                TG_TABLE_NAME, 'adk_sessions_display_name_sane'
                USING ERRCODE = 'check_violation', CONSTRAINT = 'adk_sessions_display_name_sane',
                      SCHEMA = TG_TABLE_SCHEMA, TABLE = TG_TABLE_NAME, COLUMN = 'display_name',
                      DETAIL = pg_catalog.format('The display name %s.', rule);
        END IF;
    END IF;
    -- NULL labels are the NOT NULL constraint's to refuse, after this.
    IF NEW.labels IS NOT NULL AND pg_catalog.jsonb_typeof(NEW.labels) <> 'object' THEN
        RAISE EXCEPTION 'new row for relation "%" violates check constraint "%"',
            TG_TABLE_NAME, 'adk_sessions_labels_is_object'
            USING ERRCODE = 'check_violation', CONSTRAINT = 'adk_sessions_labels_is_object',
                  SCHEMA = TG_TABLE_SCHEMA, TABLE = TG_TABLE_NAME, COLUMN = 'labels',
                  DETAIL = 'Labels are a JSON object.';
    END IF;
    -- One pass over the labels; jsonb keeps an object's keys sorted and
    -- unique, so the 33rd is the first one too many.
    FOR label IN SELECT l.key, l.value FROM pg_catalog.jsonb_each(NEW.labels) l LOOP
        labels_seen := labels_seen + 1;
        rule := CASE
            WHEN labels_seen > 32 THEN 'There are more than 32 labels.'
            WHEN label.key !~ '^[a-z0-9][a-z0-9_./-]{0,62}$'
                THEN pg_catalog.format('The label key %s must be 1 to 63 lowercase letters, digits, ''_'', ''-'', '
                                       '''.'' or ''/'', starting with a letter or a digit.',
                                       pg_catalog.quote_literal(label.key))
            WHEN pg_catalog.jsonb_typeof(label.value) <> 'string'
                THEN pg_catalog.format('The label %s has a value that is not a string.',
                                       pg_catalog.quote_literal(label.key))
            WHEN pg_catalog.char_length(label.value #>> '{}') > 256
                THEN pg_catalog.format('The label %s has a value longer than 256 characters.',
                                       pg_catalog.quote_literal(label.key))
            WHEN (label.value #>> '{}') ~ '[\u0001-\u001f\u007f-\u009f]'
                THEN pg_catalog.format('The label %s has a value with a control character.',
                                       pg_catalog.quote_literal(label.key))
        END;
        EXIT WHEN rule IS NOT NULL;
    END LOOP;
    IF rule IS NOT NULL THEN
        RAISE EXCEPTION 'new row for relation "%" violates check constraint "%"',
            TG_TABLE_NAME, 'adk_sessions_labels_sane'
            USING ERRCODE = 'check_violation', CONSTRAINT = 'adk_sessions_labels_sane',
                  SCHEMA = TG_TABLE_SCHEMA, TABLE = TG_TABLE_NAME, COLUMN = 'labels', DETAIL = rule;
    END IF;
    RETURN NEW;
END;
$$;
REVOKE EXECUTE ON FUNCTION adk_session_metadata_check() FROM PUBLIC;

-- Rollover: the successor carries the display name and labels on, as it
-- carries the session state. Same signature, so replaced in place.
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
SECURITY DEFINER
SET plan_cache_mode = force_custom_plan
SET search_path = pg_catalog, :"store_schema", pg_temp
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
    SELECT a.state, a.expires_at, a.closed_at, a.successor_id, a.display_name, a.labels
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
    INSERT INTO adk_sessions (app_name, user_id, session_id, state, initial_state, last_seq, expires_at,
                              display_name, labels)
    VALUES (p_app_name, p_user_id, p_successor_id, old.state, old.state, 1, pg_catalog.now() + ttl,
            old.display_name, old.labels)
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
REVOKE EXECUTE ON FUNCTION adk_rollover_session(p_tenant text, p_app_name text, p_user_id text, p_session_id text, p_successor_id text, p_event_id text, p_invocation_id text, p_author text, p_event_ts bigint, p_payload jsonb, p_ttl interval) FROM PUBLIC;

CREATE OR REPLACE FUNCTION adk_rewind_session(
    p_tenant       text,
    p_app_name     text,
    p_user_id      text,
    p_session_id   text,
    p_keep         bigint,
    p_expected_seq bigint
) RETURNS TABLE (outcome text, seq bigint)
LANGUAGE plpgsql
SECURITY DEFINER
SET plan_cache_mode = force_custom_plan
SET search_path = pg_catalog, :"store_schema", pg_temp
AS $$
#variable_conflict use_column
DECLARE
    s      record;
    folded jsonb;
BEGIN
    IF NOT adk_tenant_allows(p_tenant, p_app_name) THEN
        PERFORM adk_tenant_require(p_tenant, p_app_name);
    END IF;
    SELECT a.last_seq, a.session_day, a.expires_at, a.initial_state INTO s
      FROM adk_sessions a
     WHERE a.app_name = p_app_name AND a.user_id = p_user_id AND a.session_id = p_session_id
       FOR NO KEY UPDATE;
    IF NOT FOUND OR (s.expires_at IS NOT NULL AND s.expires_at <= pg_catalog.now()) THEN
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
    SELECT coalesce(pg_catalog.jsonb_object_agg(d.key, d.value ORDER BY e.seq), '{}'::jsonb) INTO folded
      FROM adk_events e
     CROSS JOIN LATERAL pg_catalog.jsonb_each(coalesce(e.payload -> 'actions' -> 'state_delta', '{}'::jsonb)) d
     WHERE e.app_name = p_app_name AND e.user_id = p_user_id AND e.session_id = p_session_id
       AND e.session_day = s.session_day AND e.seq <= p_keep
       AND d.key NOT LIKE 'app:%' AND d.key NOT LIKE 'user:%' AND d.key NOT LIKE 'temp:%';

    UPDATE adk_sessions a
       SET last_seq = p_keep, state = s.initial_state || folded, updated_at = greatest(pg_catalog.now(), a.updated_at)
     WHERE a.app_name = p_app_name AND a.user_id = p_user_id AND a.session_id = p_session_id;
    RETURN QUERY SELECT 'rewound'::text, p_keep;
END;
$$;
REVOKE EXECUTE ON FUNCTION adk_rewind_session(p_tenant text, p_app_name text, p_user_id text, p_session_id text, p_keep bigint, p_expected_seq bigint) FROM PUBLIC;

-- Forking a conversation: a new session of the same app and user that
-- starts from the first N events of another. One function, so the copy is
-- one statement, atomic, and a service role needs no privilege on the
-- tables.
CREATE OR REPLACE FUNCTION adk_fork_session(
    p_tenant     text,
    p_app_name   text,
    p_user_id    text,
    p_session_id text,
    p_new_id     text,
    p_at_seq     bigint,
    p_ttl        interval
) RETURNS TABLE (outcome text, seq bigint)
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, :"store_schema", pg_temp
AS $$
#variable_conflict use_column
DECLARE
    s      record;
    born   record;
    ttl    interval;
    folded jsonb;
BEGIN
    IF NOT adk_tenant_allows(p_tenant, p_app_name) THEN
        PERFORM adk_tenant_require(p_tenant, p_app_name);
    END IF;
    -- FOR SHARE: a rewind (which deletes events under FOR NO KEY UPDATE)
    -- cannot run between reading last_seq and copying the events, so the
    -- fork holds exactly events 1..p_at_seq. Appends to the original wait
    -- for the copy; they would not change events 1..p_at_seq anyway.
    SELECT a.last_seq, a.session_day, a.expires_at, a.initial_state, a.display_name, a.labels INTO s
      FROM adk_sessions a
     WHERE a.app_name = p_app_name AND a.user_id = p_user_id AND a.session_id = p_session_id
       FOR SHARE;
    IF NOT FOUND OR (s.expires_at IS NOT NULL AND s.expires_at <= pg_catalog.now()) THEN
        RETURN QUERY SELECT 'not_found'::text, NULL::bigint;
        RETURN;
    END IF;
    IF p_at_seq < 0 OR p_at_seq > s.last_seq THEN
        RETURN QUERY SELECT 'beyond'::text, s.last_seq;
        RETURN;
    END IF;

    -- The id of an expired session that is not purged yet is free at once,
    -- as for create.
    DELETE FROM adk_sessions x
     WHERE x.app_name = p_app_name AND x.user_id = p_user_id AND x.session_id = p_new_id
       AND x.expires_at <= pg_catalog.now();

    -- Session state as rewind rebuilds it: the initial state, then the
    -- session-scoped deltas of the kept events in seq order (jsonb keeps
    -- the last value of a repeated key). App and user state are shared and
    -- already hold those events' deltas.
    SELECT coalesce(pg_catalog.jsonb_object_agg(d.key, d.value ORDER BY e.seq), '{}'::jsonb) INTO folded
      FROM adk_events e
     CROSS JOIN LATERAL pg_catalog.jsonb_each(coalesce(e.payload -> 'actions' -> 'state_delta', '{}'::jsonb)) d
     WHERE e.app_name = p_app_name AND e.user_id = p_user_id AND e.session_id = p_session_id
       AND e.session_day = s.session_day AND e.seq <= p_at_seq
       AND d.key NOT LIKE 'app:%' AND d.key NOT LIKE 'user:%' AND d.key NOT LIKE 'temp:%';

    SELECT least(adk_policy_seconds(p_ttl), adk_policy_seconds(p.default_ttl)) INTO ttl FROM adk_store_policy p;
    INSERT INTO adk_sessions (app_name, user_id, session_id, state, initial_state, last_seq, expires_at,
                              display_name, labels)
    VALUES (p_app_name, p_user_id, p_new_id, s.initial_state || folded, s.initial_state, p_at_seq,
            pg_catalog.now() + ttl, s.display_name, s.labels)
    ON CONFLICT DO NOTHING
    RETURNING adk_sessions.session_day INTO born;
    IF NOT FOUND THEN
        RETURN QUERY SELECT 'exists'::text, NULL::bigint;
        RETURN;
    END IF;

    -- The copies keep their original arrival time (created_at): they are
    -- not new model calls, and the usage rollup, which finds new events by
    -- arrival, has counted the originals once already.
    INSERT INTO adk_events (app_name, user_id, session_id, session_day, seq, event_id, invocation_id,
                            author, event_ts, created_at, payload, blob_refs)
    SELECT e.app_name, e.user_id, p_new_id, born.session_day, e.seq, e.event_id, e.invocation_id,
           e.author, e.event_ts, e.created_at, e.payload, e.blob_refs
      FROM adk_events e
     WHERE e.app_name = p_app_name AND e.user_id = p_user_id AND e.session_id = p_session_id
       AND e.session_day = s.session_day AND e.seq <= p_at_seq;
    -- The copies name the same media: each is one more reference to it, so
    -- deleting the original leaves the fork's media in place. (Citus stores
    -- no media apart, and its workers have no adk_blobs.)
    IF NOT adk_on_citus() THEN
        PERFORM adk_hold_copied_blobs(p_app_name, p_user_id, p_new_id, born.session_day);
    END IF;

    RETURN QUERY SELECT 'forked'::text, p_at_seq;
END;
$$;
REVOKE EXECUTE ON FUNCTION adk_fork_session(p_tenant text, p_app_name text, p_user_id text, p_session_id text, p_new_id text, p_at_seq bigint, p_ttl interval) FROM PUBLIC;

CREATE OR REPLACE FUNCTION adk_delete_session(p_tenant text, p_app_name text, p_user_id text, p_session_id text)
RETURNS bigint
LANGUAGE plpgsql
SECURITY DEFINER
SET plan_cache_mode = force_custom_plan
SET search_path = pg_catalog, :"store_schema", pg_temp
AS $$
DECLARE
    deleted bigint;
BEGIN
    IF NOT adk_tenant_allows(p_tenant, p_app_name) THEN
        PERFORM adk_tenant_require(p_tenant, p_app_name);
    END IF;
    DELETE FROM adk_sessions s
    WHERE s.app_name = p_app_name AND s.user_id = p_user_id AND s.session_id = p_session_id;
    GET DIAGNOSTICS deleted = ROW_COUNT;
    RETURN deleted;
END;
$$;
REVOKE EXECUTE ON FUNCTION adk_delete_session(p_tenant text, p_app_name text, p_user_id text, p_session_id text) FROM PUBLIC;
