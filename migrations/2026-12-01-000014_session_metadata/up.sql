-- Session metadata (issue #16): an optional display name and labels (a flat
-- string-to-string map) per session, set at create and replaced by
-- adk_set_session_metadata; list filters by labels (every given label must
-- match) and by an updated_at window, still keyset-paged.
--
-- Neither is part of the conversation: changing them is not an append and
-- moves neither last_seq nor updated_at. Appends never write either column,
-- so the one new index (on labels) keeps appends HOT; only a change of the
-- labels themselves is a non-HOT update.
--
-- Lock budget: every statement on adk_sessions here is catalog-only except
-- the index build, which scans the table under a SHARE lock (appends wait)
-- but indexes no row yet: every existing session has the default, empty
-- labels, which the partial index leaves out (on 1M sessions: 0.36 s).

SET LOCAL lock_timeout = '5s';

-- Two columns; with a constant default, adding them is catalog-only.
ALTER TABLE adk_sessions
    ADD COLUMN display_name text,
    ADD COLUMN labels jsonb NOT NULL DEFAULT '{}';

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
CREATE FUNCTION adk_session_metadata_check() RETURNS trigger
LANGUAGE plpgsql
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

CREATE TRIGGER adk_sessions_metadata_checks
    BEFORE INSERT OR UPDATE OF display_name, labels ON adk_sessions
    FOR EACH ROW
    WHEN (NEW.display_name IS NOT NULL OR NEW.labels IS DISTINCT FROM '{}'::jsonb)
    EXECUTE FUNCTION adk_session_metadata_check();

-- The label filter's index: GIN with jsonb_path_ops on the labels, which
-- serves `labels @> filter` (every given label, same value) with one entry
-- per label. A list is always for one app and user; the primary key's
-- (app_name, user_id) prefix narrows to them, and the planner picks the
-- key, the labels, or both per call (the list plans a filtered page with its
-- arguments). Measured (first page, EXPLAIN ANALYZE) on 100k sessions of one
-- user, on 100k spread over 1000 users, and on that big user among 900k
-- sessions of 999 others, against two indexes that keep app and user in
-- the key:
-- * app, user and labels in one jsonb expression: PostgreSQL cannot
--   estimate containment in it, so it took that index even for a filter
--   matching 70% of the user's sessions, 100 ms against the key's 38 ms;
--   slower than the labels alone for the big user (1.2 against 0.8 ms).
--   Its one win, a label common in the app but rare for a small user
--   (1.6 against 9 ms), is a case the key alone serves in 4 ms.
-- * btree_gin's (app_name, user_id, labels): best for the big user among
--   the many (1.2 against 8 ms for a rare label: the labels alone hand the
--   heap every user's matches), four times slower for a small user (2.6
--   against 0.6 ms), and an extension to install.
-- The labels alone: fastest for the one big user (0.8 ms for a label on
-- 0.1% of 100k), estimated well enough that the planner falls back to the
-- key when a filter matches much, and no extension. Its price is a label
-- the rest of the app carries too: the big user among many, 8 ms (btree_gin
-- 1.2), and in the 1M table a small user with a label on a tenth of the
-- app, 9 ms (the planner ANDs the key with the label index; the key alone
-- takes 4). Both grow with the other users' sessions carrying the label:
-- revisit with btree_gin if big users are listed by labels most users carry.
-- Partial: sessions without labels (most, and every one from before this
-- migration) are not in it, so creating them costs no index write and
-- building it here indexes nothing. The list states `labels <> '{}'`, which
-- any non-empty filter implies, so the planner can match the predicate.
-- fastupdate off: a pending list would be scanned by every filtered list
-- until vacuum merged it; labels change rarely, so writing the entries at
-- once is the cheaper side. Appends never write labels: they stay HOT.
CREATE INDEX adk_sessions_labels ON adk_sessions USING gin (labels jsonb_path_ops)
    WITH (fastupdate = off) WHERE labels <> '{}'::jsonb;

-- Create, with the display name and labels. The signature changes, so the
-- old function goes (CREATE OR REPLACE would add an overload beside it).
-- The new arguments come last and have defaults, so a call written for the
-- old signature (an operator's script, a test) still runs; the store binds
-- every argument.
DROP FUNCTION adk_create_session(text, text, text, text, jsonb, interval, jsonb, jsonb);

CREATE FUNCTION adk_create_session(
    p_tenant       text,
    p_app_name     text,
    p_user_id      text,
    p_session_id   text,
    p_state        jsonb,
    p_ttl          interval,
    p_user_delta   jsonb,
    p_app_delta    jsonb,
    p_display_name text DEFAULT NULL,
    p_labels       jsonb DEFAULT '{}'
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
    INSERT INTO adk_sessions (app_name, user_id, session_id, state, initial_state, expires_at, display_name, labels)
    VALUES (p_app_name, p_user_id, p_session_id, p_state, p_state, pg_catalog.now() + ttl, p_display_name,
            coalesce(p_labels, '{}'::jsonb))
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

-- Get, returning the display name and labels on the session row. The
-- result type changes, so the old function goes.
DROP FUNCTION adk_get_session(text, text, text, text, bigint, bigint);

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
    display_name text,
    labels       jsonb,
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
           a.successor_id, a.display_name, a.labels,
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
                        s.closed_at, s.successor_id, s.display_name, s.labels, s.user_state, s.app_state,
                        NULL::jsonb;
    IF s.last_seq = 0 OR p_limit = 0 THEN
        RETURN;
    END IF;
    -- The one read of a partition, planned with its arguments on every call
    -- (EXECUTE): a cached generic plan made while the day's partition was
    -- small would go on scanning it sequentially once it filled. The session
    -- read above is by primary key and keeps its cached plan.
    RETURN QUERY EXECUTE
        'SELECT NULL::jsonb, NULL::bigint, NULL::date, NULL::timestamptz, NULL::timestamptz,
                NULL::timestamptz, NULL::timestamptz, NULL::text, NULL::text, NULL::jsonb, NULL::jsonb,
                NULL::jsonb, recent.payload
           FROM (SELECT e.seq, e.payload FROM adk_events e
                  WHERE e.app_name = $1 AND e.user_id = $2 AND e.session_id = $3 AND e.session_day = $4
                    AND e.seq <= $5 AND ($6::bigint IS NULL OR e.event_ts >= $6)
                  ORDER BY e.seq DESC
                  LIMIT $7) recent
          ORDER BY recent.seq'
        USING p_app_name, p_user_id, p_session_id, s.session_day, s.last_seq, p_after_ts, p_limit;
END;
$$;

-- List, with the label filter and the updated_at window, returning the
-- display name and labels. The arguments change, so the old function goes;
-- the new ones come last, with defaults, as for create.
--
-- Without a label filter the page is read as before, through the primary
-- key's (app_name, user_id) prefix, on a cached plan. With one, the
-- statement is planned with its arguments on every call (EXECUTE): how
-- many of the user's sessions carry the labels decides between the label
-- index (few) and the primary key (many, or a user with few sessions), and
-- a cached generic plan would make that choice once for every filter.
-- `labels <> '{}'` is implied by any non-empty filter; it is spelled out so
-- that the planner can use the partial index. No index serves updated_at
-- (appends move it: it must stay out of every index), so the window is a
-- filter on the rows the key or the labels found.
DROP FUNCTION adk_list_sessions(text, text, text, timestamptz, text, bigint);

CREATE FUNCTION adk_list_sessions(
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

-- Replaces a session's display name and labels, and nothing else: not
-- last_seq, not updated_at (it is not an append), and a closed session may
-- still be renamed. A missing or expired session, or one of another user,
-- is 'not_found'. A write, so a role that may not act for the app is
-- refused with 42501 and nothing is written. The row lock is the append's
-- (FOR NO KEY UPDATE: labels are in no unique index), so a concurrent
-- append waits for it, or it for the append, and neither loses the other's
-- columns.
CREATE FUNCTION adk_set_session_metadata(
    p_tenant       text,
    p_app_name     text,
    p_user_id      text,
    p_session_id   text,
    p_display_name text,
    p_labels       jsonb
) RETURNS TABLE (outcome text)
LANGUAGE plpgsql
SECURITY DEFINER
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

-- CREATE OR REPLACE resets a function's SET clauses, and new functions
-- start without them: pin the path on every function defined here. PUBLIC
-- may execute none of the new ones.
DO $$
DECLARE
    f regprocedure;
BEGIN
    FOREACH f IN ARRAY ARRAY[
        'adk_create_session(text, text, text, text, jsonb, interval, jsonb, jsonb, text, jsonb)',
        'adk_get_session(text, text, text, text, bigint, bigint)',
        'adk_list_sessions(text, text, text, timestamptz, text, bigint, jsonb, timestamptz, timestamptz)',
        'adk_rollover_session(text, text, text, text, text, text, text, text, bigint, jsonb, interval)',
        'adk_set_session_metadata(text, text, text, text, text, jsonb)',
        'adk_session_metadata_check()'
    ]::regprocedure[] LOOP
        EXECUTE pg_catalog.format('ALTER FUNCTION %s SET search_path = pg_catalog, %I, pg_temp',
                                  f, pg_catalog.current_schema());
        EXECUTE pg_catalog.format('REVOKE EXECUTE ON FUNCTION %s FROM PUBLIC', f);
    END LOOP;
END;
$$;

-- Roles already bound to apps may run the new functions as they ran the
-- ones they replace, and set metadata, without re-running their setup.
DO $$
DECLARE
    r regrole;
    f regprocedure;
BEGIN
    FOR r IN SELECT DISTINCT b.role_oid::regrole FROM adk_role_apps b
              WHERE EXISTS (SELECT FROM pg_catalog.pg_roles x WHERE x.oid = b.role_oid) LOOP
        FOREACH f IN ARRAY ARRAY[
            'adk_create_session(text, text, text, text, jsonb, interval, jsonb, jsonb, text, jsonb)',
            'adk_get_session(text, text, text, text, bigint, bigint)',
            'adk_list_sessions(text, text, text, timestamptz, text, bigint, jsonb, timestamptz, timestamptz)',
            'adk_set_session_metadata(text, text, text, text, text, jsonb)'
        ]::regprocedure[] LOOP
            EXECUTE pg_catalog.format('GRANT EXECUTE ON FUNCTION %s TO %s', f, r);
        END LOOP;
    END LOOP;
END;
$$;
