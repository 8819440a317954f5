-- Erasing a user: the check, the preview, the audit row, and the batches
-- that delete a user's sessions, events and state.
--
-- Installed after every migrate, in one transaction with the other files
-- (crates/schema/src/replaceable.rs). Each function is stated whole, with
-- its SET clauses and grants: change it here, not in a migration.

-- The audit record's user hash. One expression, inlined where it is called.
CREATE OR REPLACE FUNCTION adk_user_hash(p_user_id text) RETURNS text
    LANGUAGE sql STABLE STRICT PARALLEL SAFE
    RETURN pg_catalog.encode(pg_catalog.sha256(pg_catalog.convert_to(p_user_id, 'UTF8')), 'hex');
REVOKE EXECUTE ON FUNCTION adk_user_hash(p_user_id text) FROM PUBLIC;

-- Bad ids are refused as a session's would be (the store's newtypes refuse
-- them first, naming the field); the constraint named is the sessions'.
CREATE OR REPLACE FUNCTION adk_erase_user_check(p_app_name text, p_user_id text) RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, :"store_schema", pg_temp
AS $$
BEGIN
    IF p_app_name IS NULL OR pg_catalog.length(p_app_name) NOT BETWEEN 1 AND 128 THEN
        RAISE EXCEPTION 'app_name must be 1 to 128 characters'
            USING ERRCODE = 'check_violation', CONSTRAINT = 'adk_sessions_app_name_sane';
    END IF;
    IF p_user_id IS NULL OR pg_catalog.length(p_user_id) NOT BETWEEN 1 AND 128 THEN
        RAISE EXCEPTION 'user_id must be 1 to 128 characters'
            USING ERRCODE = 'check_violation', CONSTRAINT = 'adk_sessions_user_id_sane';
    END IF;
END;
$$;
REVOKE EXECUTE ON FUNCTION adk_erase_user_check(p_app_name text, p_user_id text) FROM PUBLIC;

-- What an erasure would remove, counted in one snapshot; writes nothing.
-- Also names the user's running (interrupted) erasure, which a real run
-- would resume.
CREATE OR REPLACE FUNCTION adk_erase_user_preview(p_tenant text, p_app_name text, p_user_id text)
RETURNS TABLE (
    user_hash          text,
    sessions           bigint,
    events             bigint,
    usage_tails        bigint,
    user_state         boolean,
    running_erasure_id bigint
)
LANGUAGE plpgsql
STABLE
SECURITY DEFINER
SET search_path = pg_catalog, :"store_schema", pg_temp
AS $$
#variable_conflict use_column
DECLARE
    s record;
    n bigint;
BEGIN
    -- Refused loudly, as the erasure itself would be: a silent empty answer
    -- would read as "nothing to erase".
    IF NOT adk_tenant_allows(p_tenant, p_app_name) THEN
        PERFORM adk_tenant_require(p_tenant, p_app_name);
    END IF;
    PERFORM adk_erase_user_check(p_app_name, p_user_id);
    user_hash := adk_user_hash(p_user_id);
    sessions := 0;
    events := 0;
    FOR s IN SELECT a.session_id, a.session_day FROM adk_sessions a
              WHERE a.app_name = p_app_name AND a.user_id = p_user_id LOOP
        sessions := sessions + 1;
        EXECUTE 'SELECT pg_catalog.count(*) FROM adk_events e WHERE e.app_name = $1 AND e.user_id = $2 AND e.session_id = $3 AND e.session_day = $4'
           INTO n USING p_app_name, p_user_id, s.session_id, s.session_day;
        events := events + n;
    END LOOP;
    SELECT pg_catalog.count(*) INTO usage_tails FROM adk_usage_invocation_tails t
     WHERE t.app_name = p_app_name AND t.user_id = p_user_id;
    user_state := EXISTS (SELECT FROM adk_user_states us WHERE us.app_name = p_app_name AND us.user_id = p_user_id);
    SELECT x.erasure_id INTO running_erasure_id FROM adk_user_erasures x
     WHERE x.app_name = p_app_name AND x.user_hash = adk_user_hash(p_user_id) AND x.status = 'running';
    RETURN NEXT;
END;
$$;
REVOKE EXECUTE ON FUNCTION adk_erase_user_preview(p_tenant text, p_app_name text, p_user_id text) FROM PUBLIC;

CREATE OR REPLACE FUNCTION adk_erase_user_begin(p_tenant text, p_app_name text, p_user_id text)
RETURNS TABLE (erasure_id bigint, user_hash text, runs integer, started_at timestamptz)
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, :"store_schema", pg_temp
AS $$
#variable_conflict use_column
BEGIN
    IF NOT adk_tenant_allows(p_tenant, p_app_name) THEN
        PERFORM adk_tenant_require(p_tenant, p_app_name);
    END IF;
    PERFORM adk_erase_user_check(p_app_name, p_user_id);
    RETURN QUERY
    INSERT INTO adk_user_erasures AS x (app_name, user_hash, started_by)
    VALUES (p_app_name, adk_user_hash(p_user_id), adk_acting_role_name())
    ON CONFLICT (app_name, user_hash) WHERE status = 'running'
    DO UPDATE SET runs = x.runs + 1
    RETURNING x.erasure_id, x.user_hash, x.runs, x.started_at;
END;
$$;
REVOKE EXECUTE ON FUNCTION adk_erase_user_begin(p_tenant text, p_app_name text, p_user_id text) FROM PUBLIC;

CREATE OR REPLACE FUNCTION adk_erase_user_batch(
    p_tenant     text,
    p_app_name   text,
    p_user_id    text,
    p_erasure_id bigint,
    p_batch_size integer
) RETURNS TABLE (
    step        text,
    affected    bigint,
    sessions    bigint,
    events      bigint,
    usage_tails bigint,
    user_state  boolean
)
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, :"store_schema", pg_temp
AS $$
#variable_conflict use_column
DECLARE
    -- The erasure's mark: an instant written with its offset, so no
    -- TimeZone setting changes it.
    marked     CONSTANT timestamptz := '1970-01-01 00:00:00+00';
    progress   text;
    s          record;
    n          bigint := 0;
    floor_seq  bigint;
    outcome    text;
    finished   boolean := false;
    d_sessions bigint := 0;
    d_events   bigint := 0;
    d_tails    bigint := 0;
    d_state    boolean := false;
BEGIN
    IF NOT adk_tenant_allows(p_tenant, p_app_name) THEN
        PERFORM adk_tenant_require(p_tenant, p_app_name);
    END IF;
    PERFORM adk_erase_user_check(p_app_name, p_user_id);
    IF p_batch_size IS NULL OR p_batch_size NOT BETWEEN 1 AND 100000 THEN
        RAISE EXCEPTION 'batch_size must be 1 to 100000, not %', coalesce(p_batch_size::text, 'NULL')
            USING ERRCODE = 'invalid_parameter_value';
    END IF;

    -- The audit row first: two runs of one erasure take turns here, so they
    -- never wait for each other's session locks in opposite orders.
    SELECT x.status INTO progress
      FROM adk_user_erasures x
     WHERE x.erasure_id = p_erasure_id AND x.app_name = p_app_name AND x.user_hash = adk_user_hash(p_user_id)
       FOR UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'erasure % is not an erasure of this user of app %', coalesce(p_erasure_id::text, 'NULL'),
            p_app_name USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF progress = 'done' THEN
        -- Finished by a concurrent run of the same erasure.
        RETURN QUERY SELECT 'done'::text, 0::bigint, x.sessions, x.events, x.usage_tails, x.user_state
                       FROM adk_user_erasures x WHERE x.erasure_id = p_erasure_id;
        RETURN;
    END IF;

    <<work>>
    BEGIN
        -- 1. Hide the user's sessions not hidden yet, a batch at a time. An
        --    append holding a row's lock is waited for; so is a rollover or
        --    fork reading it.
        UPDATE adk_sessions a
           SET expires_at = marked
          FROM (SELECT b.session_id FROM adk_sessions b
                 WHERE b.app_name = p_app_name AND b.user_id = p_user_id AND b.expires_at IS DISTINCT FROM marked
                 ORDER BY b.session_id
                 LIMIT p_batch_size) pick
         WHERE a.app_name = p_app_name AND a.user_id = p_user_id AND a.session_id = pick.session_id
           AND a.expires_at IS DISTINCT FROM marked;
        GET DIAGNOSTICS n = ROW_COUNT;
        IF n > 0 THEN
            outcome := 'marked';
            EXIT work;
        END IF;

        -- 2. One hidden session: its newest events, then the row itself.
        SELECT a.session_id, a.session_day, a.last_seq INTO s
          FROM adk_sessions a
         WHERE a.app_name = p_app_name AND a.user_id = p_user_id AND a.expires_at = marked
         ORDER BY a.session_id
         LIMIT 1
           FOR UPDATE;
        IF FOUND THEN
            IF s.last_seq > 0 THEN
                -- seq is unique in a session, so the range holds at most a
                -- batch. Planned with its arguments on every call (EXECUTE),
                -- so the session's day prunes to its one partition.
                floor_seq := greatest(s.last_seq - p_batch_size, 0);
                EXECUTE 'DELETE FROM adk_events e WHERE e.app_name = $1 AND e.user_id = $2 AND e.session_id = $3 AND e.session_day = $4 AND e.seq > $5 AND e.seq <= $6'
                  USING p_app_name, p_user_id, s.session_id, s.session_day, floor_seq, s.last_seq;
                GET DIAGNOSTICS n = ROW_COUNT;
                UPDATE adk_sessions a SET last_seq = floor_seq
                 WHERE a.app_name = p_app_name AND a.user_id = p_user_id AND a.session_id = s.session_id;
                d_events := n;
                outcome := 'events';
            ELSE
                -- The cascade (one partition: the key carries the day) takes
                -- whatever was written above last_seq behind the store's back.
                DELETE FROM adk_sessions a
                 WHERE a.app_name = p_app_name AND a.user_id = p_user_id AND a.session_id = s.session_id
                   AND a.session_day = s.session_day;
                GET DIAGNOSTICS n = ROW_COUNT;
                d_sessions := n;
                outcome := 'session';
            END IF;
            EXIT work;
        END IF;

        -- 3. A hidden session went under the lock above, or a new one came.
        IF EXISTS (SELECT FROM adk_sessions a WHERE a.app_name = p_app_name AND a.user_id = p_user_id) THEN
            outcome := 'busy';
            EXIT work;
        END IF;

        -- 4. A rollup run holds its state row from start to commit, and may
        --    write tails of events it read before they were deleted: wait
        --    for it (the caller calls again) rather than delete tails it is
        --    about to write back. KEY SHARE: two erasures do not exclude
        --    each other; a rollup starting now skips this turn.
        PERFORM 1 FROM adk_usage_state u FOR KEY SHARE SKIP LOCKED;
        IF NOT FOUND AND EXISTS (SELECT FROM adk_usage_state) THEN
            outcome := 'waiting';
            EXIT work;
        END IF;

        -- 5. The user's invocation tails, a batch at a time.
        DELETE FROM adk_usage_invocation_tails t
         WHERE (t.app_name, t.user_id, t.session_id, t.session_day, t.invocation_id) IN (
               SELECT v.app_name, v.user_id, v.session_id, v.session_day, v.invocation_id
                 FROM adk_usage_invocation_tails v
                WHERE v.app_name = p_app_name AND v.user_id = p_user_id
                LIMIT p_batch_size);
        GET DIAGNOSTICS d_tails = ROW_COUNT;
        n := d_tails;
        IF d_tails >= p_batch_size THEN
            outcome := 'tails';
            EXIT work;
        END IF;

        -- 6. The user's state, and the audit of redactions of the user's
        --    events (it names the user and the sessions).
        DELETE FROM adk_user_states us WHERE us.app_name = p_app_name AND us.user_id = p_user_id;
        d_state := FOUND;
        DELETE FROM adk_event_redactions r WHERE r.app_name = p_app_name AND r.user_id = p_user_id;
        IF d_state THEN
            n := n + 1;
        END IF;

        -- 7. Done only if, after that, the user has no session: one created
        --    (and committed) meanwhile may have written user state again.
        IF EXISTS (SELECT FROM adk_sessions a WHERE a.app_name = p_app_name AND a.user_id = p_user_id) THEN
            outcome := 'busy';
            EXIT work;
        END IF;
        finished := true;
        outcome := 'done';
    END work;

    UPDATE adk_user_erasures x
       SET batches = x.batches + 1,
           sessions = x.sessions + d_sessions,
           events = x.events + d_events,
           usage_tails = x.usage_tails + d_tails,
           user_state = x.user_state OR d_state,
           status = CASE WHEN finished THEN 'done' ELSE x.status END,
           finished_at = CASE WHEN finished THEN pg_catalog.now() ELSE x.finished_at END,
           finished_by = CASE WHEN finished THEN adk_acting_role_name() ELSE x.finished_by END
     WHERE x.erasure_id = p_erasure_id
    RETURNING x.sessions, x.events, x.usage_tails, x.user_state
         INTO sessions, events, usage_tails, user_state;
    step := outcome;
    affected := n;
    RETURN NEXT;
END;
$$;
REVOKE EXECUTE ON FUNCTION adk_erase_user_batch(p_tenant text, p_app_name text, p_user_id text, p_erasure_id bigint, p_batch_size integer) FROM PUBLIC;
