-- Tenancy that holds against a wrong role, not only a forgotten filter.
--
-- Before this migration any role could act for any app: row-level security
-- compared app_name with `adk.app_name`, which every role may set. Now:
--
-- * A role acts only for the apps it is bound to in adk_role_apps (a NULL
--   app, from `--all-apps`, is the explicit choice for a trusted router). The
--   store's owner (and a superuser) acts for every app, as before.
-- * The service role holds no table privilege at all: every operation is a
--   SECURITY DEFINER function that checks the binding itself, so the role
--   cannot rewrite an event, move a session's clock or pick an event's seq.
-- * Row-level security, enabled and forced, guards every table holding
--   tenant rows and every partition of adk_events, for the roles an
--   operator grants direct reads to.
-- * Every function resolves names only in pg_catalog and the store's schema.
--
-- "The acting role" is the role the session acts as: the one it `SET ROLE`
-- to, else the one it logged in as. Inside a SECURITY DEFINER function
-- current_user is the owner, so the functions cannot use it.

CREATE TABLE adk_role_apps (
    role_oid oid  NOT NULL,
    -- NULL: every app. Only `adk-pg service-role --all-apps` writes it.
    app_name text,
    bound_at timestamptz NOT NULL DEFAULT pg_catalog.now(),
    bound_by name NOT NULL DEFAULT session_user,
    CONSTRAINT adk_role_apps_key UNIQUE NULLS NOT DISTINCT (role_oid, app_name),
    CONSTRAINT adk_role_apps_app_name CHECK (app_name <> '')
);

-- Every binding made or removed, by whom and when, whatever wrote it.
CREATE TABLE adk_role_app_changes (
    changed_at timestamptz NOT NULL DEFAULT pg_catalog.now(),
    changed_by name        NOT NULL DEFAULT session_user,
    role_oid   oid         NOT NULL,
    role_name  name,
    app_name   text,
    change     text        NOT NULL CHECK (change IN ('bound', 'unbound'))
);

CREATE FUNCTION adk_role_apps_log() RETURNS trigger
LANGUAGE plpgsql
AS $$
BEGIN
    -- An UPDATE is logged as what it amounts to: one unbinding, one binding.
    IF TG_OP IN ('UPDATE', 'DELETE') THEN
        INSERT INTO adk_role_app_changes (role_oid, role_name, app_name, change)
        SELECT OLD.role_oid, r.rolname, OLD.app_name, 'unbound' FROM (SELECT NULL) one
        LEFT JOIN pg_roles r ON r.oid = OLD.role_oid;
    END IF;
    IF TG_OP IN ('UPDATE', 'INSERT') THEN
        INSERT INTO adk_role_app_changes (role_oid, role_name, app_name, change)
        SELECT NEW.role_oid, r.rolname, NEW.app_name, 'bound' FROM (SELECT NULL) one
        LEFT JOIN pg_roles r ON r.oid = NEW.role_oid;
    END IF;
    RETURN NULL;
END;
$$;

CREATE TRIGGER adk_role_apps_log AFTER INSERT OR UPDATE OR DELETE ON adk_role_apps
    FOR EACH ROW EXECUTE FUNCTION adk_role_apps_log();

-- The role the session acts as. `role` is 'none' until a SET ROLE. One
-- expression, so a caller inlines it: it runs on every store call.
CREATE FUNCTION adk_acting_role() RETURNS oid
LANGUAGE sql STABLE
RETURN pg_catalog.to_regrole(pg_catalog.quote_ident(
    CASE WHEN pg_catalog.current_setting('role') = 'none' THEN session_user::text
         ELSE pg_catalog.current_setting('role') END))::oid;

-- The app the acting role acts for right now: `adk.app_name` when the role
-- is bound to that app (or to all apps), else NULL, which matches no row.
-- SECURITY DEFINER to read the bindings, which no other role may.
CREATE FUNCTION adk_acting_app() RETURNS text
LANGUAGE sql STABLE SECURITY DEFINER
BEGIN ATOMIC
    SELECT t.app
    FROM (SELECT nullif(pg_catalog.current_setting('adk.app_name', true), '') AS app) t
    WHERE EXISTS (SELECT 1 FROM adk_role_apps b
                  WHERE b.role_oid = adk_acting_role() AND (b.app_name = t.app OR b.app_name IS NULL));
END;

-- May the acting role run an operation on `p_app_name` with the requested
-- tenant `p_tenant`? The owner may act for any app (and with no tenant, for
-- all of them); any other role must name the tenant, ask about that same
-- app, and be bound to it. When allowed with a tenant, `adk.app_name` is set
-- for this transaction so that row-level security agrees. It runs on every
-- call, so it looks the binding (the common case) up before ownership, and
-- it is PL/pgSQL: its query plan is kept between calls, where an SQL
-- function's body would be planned again in every transaction. Only the
-- store's functions call it, as the owner: current_user is the owner here.
CREATE FUNCTION adk_tenant_allows(p_tenant text, p_app_name text) RETURNS boolean
LANGUAGE plpgsql
AS $$
DECLARE
    acting oid;
BEGIN
    IF p_tenant IS NOT NULL AND p_tenant IS DISTINCT FROM p_app_name THEN
        RETURN false;
    END IF;
    acting := adk_acting_role();
    IF p_tenant IS NULL THEN
        RETURN coalesce(pg_catalog.pg_has_role(acting, current_user, 'MEMBER'::text), false);
    END IF;
    IF NOT EXISTS (SELECT 1 FROM adk_role_apps b
                   WHERE b.role_oid = acting AND (b.app_name = p_tenant OR b.app_name IS NULL))
       AND NOT coalesce(pg_catalog.pg_has_role(acting, current_user, 'MEMBER'::text), false) THEN
        RETURN false;
    END IF;
    PERFORM pg_catalog.set_config('adk.app_name'::text, p_tenant, true);
    RETURN true;
END;
$$;

-- The same, for operations that write, called when adk_tenant_allows said
-- no: refusing is an error, so nothing is written and the caller learns why.
CREATE FUNCTION adk_tenant_require(p_tenant text, p_app_name text) RETURNS void
LANGUAGE plpgsql SECURITY DEFINER
AS $$
BEGIN
    IF NOT adk_tenant_allows(p_tenant, p_app_name) THEN
        RAISE EXCEPTION 'permission denied for app %: role % may not act for it',
            coalesce(p_app_name, '(none)'),
            coalesce((SELECT r.rolname FROM pg_roles r WHERE r.oid = adk_acting_role()), '(unknown)')
            USING ERRCODE = 'insufficient_privilege',
                  HINT = CASE WHEN p_tenant IS NULL
                              THEN 'a role that does not own the store must name its tenant'
                              ELSE 'bind the role to the app: adk-pg service-role ROLE --app APP' END;
    END IF;
END;
$$;

-- The bindings say which apps exist and who serves them: only the owner
-- reads them, even after a broad GRANT SELECT ON ALL TABLES.
ALTER TABLE adk_role_apps ENABLE ROW LEVEL SECURITY, FORCE ROW LEVEL SECURITY;
CREATE POLICY adk_owner_only ON adk_role_apps
    USING ((SELECT pg_catalog.pg_has_role(current_user, c.relowner, 'MEMBER'::text)
            FROM pg_catalog.pg_class c WHERE c.oid = 'adk_sessions'::regclass));
ALTER TABLE adk_role_app_changes ENABLE ROW LEVEL SECURITY, FORCE ROW LEVEL SECURITY;
CREATE POLICY adk_owner_only ON adk_role_app_changes
    USING ((SELECT pg_catalog.pg_has_role(current_user, c.relowner, 'MEMBER'::text)
            FROM pg_catalog.pg_class c WHERE c.oid = 'adk_sessions'::regclass));

-- The one row-level security policy, on every table holding tenant rows and
-- on every partition: the owner sees everything (and so do the store's
-- functions, which run as the owner and check the acting role first); any
-- other role sees and writes the rows of the app it is bound to and acts for.
-- Both tests are sub-selects, so a statement runs each at most once, not per
-- row, and the owner's is a catalog lookup written out rather than a
-- function: it runs in every statement of every store call.
DROP POLICY adk_tenant_isolation ON adk_sessions;
DROP POLICY adk_tenant_isolation ON adk_events;
DROP POLICY adk_tenant_isolation ON adk_user_states;
DROP POLICY adk_tenant_isolation ON adk_app_states;

CREATE FUNCTION adk_protect_tenant_table(p_table regclass) RETURNS boolean
LANGUAGE plpgsql
AS $$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_class c WHERE c.oid = p_table AND c.relrowsecurity AND c.relforcerowsecurity)
       AND EXISTS (SELECT 1 FROM pg_policy p WHERE p.polrelid = p_table AND p.polname = 'adk_tenant_isolation') THEN
        RETURN false;
    END IF;
    EXECUTE pg_catalog.format('ALTER TABLE %s ENABLE ROW LEVEL SECURITY, FORCE ROW LEVEL SECURITY', p_table);
    IF NOT EXISTS (SELECT 1 FROM pg_policy p WHERE p.polrelid = p_table AND p.polname = 'adk_tenant_isolation') THEN
        EXECUTE pg_catalog.format('CREATE POLICY adk_tenant_isolation ON %s
                            USING ((SELECT pg_catalog.pg_has_role(current_user, c.relowner, ''MEMBER''::text) FROM pg_catalog.pg_class c WHERE c.oid = ''adk_sessions''::regclass) OR app_name = (SELECT adk_acting_app()))
                            WITH CHECK ((SELECT pg_catalog.pg_has_role(current_user, c.relowner, ''MEMBER''::text) FROM pg_catalog.pg_class c WHERE c.oid = ''adk_sessions''::regclass) OR app_name = (SELECT adk_acting_app()))',
                       p_table);
    END IF;
    RETURN true;
END;
$$;

-- Protects every partition of adk_events that is not yet: premade,
-- re-attached, or the legacy table a conversion attached. Returns how many
-- it changed. Maintenance and conversion call it after they attach.
CREATE FUNCTION adk_protect_event_partitions() RETURNS integer
LANGUAGE plpgsql
AS $$
DECLARE
    changed integer := 0;
    part    regclass;
BEGIN
    FOR part IN SELECT i.inhrelid::regclass FROM pg_inherits i WHERE i.inhparent = 'adk_events'::regclass LOOP
        IF adk_protect_tenant_table(part) THEN
            changed := changed + 1;
        END IF;
    END LOOP;
    RETURN changed;
END;
$$;

SELECT adk_protect_tenant_table('adk_sessions');
SELECT adk_protect_tenant_table('adk_events');
SELECT adk_protect_tenant_table('adk_user_states');
SELECT adk_protect_tenant_table('adk_app_states');
SELECT adk_protect_event_partitions();

-- A new partition is protected in the transaction that creates it.
CREATE OR REPLACE FUNCTION adk_ensure_event_partition(day date) RETURNS boolean
    LANGUAGE plpgsql STRICT
    SET lock_timeout = '5s'
AS $$
DECLARE
    part   text := adk_event_partition_name(day);
    schema name;
BEGIN
    SELECT n.nspname INTO schema
    FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
    WHERE c.oid = 'adk_events'::regclass;

    IF EXISTS (SELECT 1 FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
               WHERE c.relname = part AND n.nspname = schema) THEN
        RETURN false;
    END IF;
    EXECUTE pg_catalog.format('CREATE TABLE %I.%I PARTITION OF adk_events FOR VALUES FROM (%L) TO (%L)',
                   schema, part, pg_catalog.to_char(day::timestamp, 'YYYY-MM-DD'), pg_catalog.to_char((day + 1)::timestamp, 'YYYY-MM-DD'));
    PERFORM adk_protect_tenant_table(pg_catalog.format('%I.%I', schema, part)::regclass);
    RETURN true;
EXCEPTION
    WHEN duplicate_table THEN
        RETURN false;
END;
$$;

-- The store's operations, now SECURITY DEFINER and checking the acting
-- role's binding first. Their bodies are those of migrations 3, 6 and 7
-- otherwise.

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

CREATE OR REPLACE FUNCTION adk_load_session(p_tenant text, p_app_name text, p_user_id text, p_session_id text)
RETURNS TABLE (
    state        jsonb,
    last_seq     bigint,
    session_day  date,
    created_at   timestamptz,
    updated_at   timestamptz,
    expires_at   timestamptz,
    closed_at    timestamptz,
    successor_id text,
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
    RETURN QUERY
    SELECT s.state, s.last_seq, s.session_day, s.created_at, s.updated_at, s.expires_at, s.closed_at,
           s.successor_id,
           (SELECT us.state FROM adk_user_states us WHERE us.app_name = s.app_name AND us.user_id = s.user_id),
           (SELECT aps.state FROM adk_app_states aps WHERE aps.app_name = s.app_name)
    FROM adk_sessions s
    WHERE s.app_name = p_app_name AND s.user_id = p_user_id AND s.session_id = p_session_id
      AND (s.expires_at IS NULL OR s.expires_at > pg_catalog.now());
END;
$$;

CREATE OR REPLACE FUNCTION adk_load_events(
    p_tenant      text,
    p_app_name    text,
    p_user_id     text,
    p_session_id  text,
    p_session_day date,
    p_max_seq     bigint,
    p_after_ts    bigint,
    p_limit       bigint
) RETURNS TABLE (payload jsonb)
LANGUAGE plpgsql
SET plan_cache_mode = force_custom_plan
SECURITY DEFINER
AS $$
#variable_conflict use_column
BEGIN
    IF NOT adk_tenant_allows(p_tenant, p_app_name) THEN
        RETURN;
    END IF;
    RETURN QUERY
    SELECT recent.payload FROM (
        SELECT e.seq, e.payload FROM adk_events e
        WHERE e.app_name = p_app_name AND e.user_id = p_user_id AND e.session_id = p_session_id
          AND e.session_day = p_session_day
          AND e.seq <= p_max_seq AND (p_after_ts IS NULL OR e.event_ts >= p_after_ts)
        ORDER BY e.seq DESC
        LIMIT p_limit
    ) recent ORDER BY recent.seq;
END;
$$;

CREATE OR REPLACE FUNCTION adk_list_sessions(
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
           us.state, aps.state
    FROM adk_sessions s
    LEFT JOIN adk_user_states us ON us.app_name = s.app_name AND us.user_id = s.user_id
    LEFT JOIN adk_app_states aps ON aps.app_name = s.app_name
    WHERE s.app_name = p_app_name AND s.user_id = p_user_id
      AND (s.expires_at IS NULL OR s.expires_at > pg_catalog.now())
      AND (p_after_time IS NULL OR (s.updated_at, s.session_id) < (p_after_time, p_after_id))
    ORDER BY s.updated_at DESC, s.session_id DESC
    LIMIT p_limit;
END;
$$;

CREATE OR REPLACE FUNCTION adk_delete_session(p_tenant text, p_app_name text, p_user_id text, p_session_id text)
RETURNS bigint
LANGUAGE plpgsql
SET plan_cache_mode = force_custom_plan
SECURITY DEFINER
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

CREATE OR REPLACE FUNCTION adk_append_event(
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
SECURITY DEFINER
AS $$
#variable_conflict use_column
DECLARE
    s          record;
    prior      record;
    lifetime   interval;
    next_seq   bigint;
    new_update timestamptz;
BEGIN
    IF NOT adk_tenant_allows(p_tenant, p_app_name) THEN
        PERFORM adk_tenant_require(p_tenant, p_app_name);
    END IF;
    SELECT a.last_seq, a.session_day, a.created_at, a.updated_at, a.expires_at,
           a.closed_at, a.successor_id
      INTO s
      FROM adk_sessions a
     WHERE a.app_name = p_app_name AND a.user_id = p_user_id AND a.session_id = p_session_id
       FOR NO KEY UPDATE;

    IF NOT FOUND OR (s.expires_at IS NOT NULL AND s.expires_at <= pg_catalog.now()) THEN
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
    IF lifetime IS NOT NULL AND s.created_at + lifetime <= pg_catalog.now() THEN
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
    new_update := greatest(pg_catalog.now(), s.updated_at);

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
        DO UPDATE SET state = u.state || EXCLUDED.state, updated_at = pg_catalog.now();
    END IF;
    IF p_app_delta IS NOT NULL AND p_app_delta <> '{}'::jsonb THEN
        INSERT INTO adk_app_states AS a (app_name, state)
        VALUES (p_app_name, p_app_delta)
        ON CONFLICT (app_name)
        DO UPDATE SET state = a.state || EXCLUDED.state, updated_at = pg_catalog.now();
    END IF;

    RETURN QUERY SELECT 'stored'::text, next_seq, s.session_day, new_update, NULL::jsonb, NULL::text,
                        NULL::interval;
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

CREATE OR REPLACE FUNCTION adk_find_sessions(p_tenant text, p_session_id text, p_limit integer)
RETURNS TABLE (app_name text, user_id text)
LANGUAGE plpgsql
SECURITY DEFINER
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
SECURITY DEFINER
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


-- Migration 7's policy trigger, with its built-ins qualified: to_jsonb takes
-- anyelement, so a to_jsonb(adk_store_policy) planted in a schema on the
-- path would be a better match than the catalog's, and run as the owner.
CREATE OR REPLACE FUNCTION adk_store_policy_guard() RETURNS trigger
LANGUAGE plpgsql
AS $$
BEGIN
    IF TG_OP = 'DELETE' THEN
        RAISE EXCEPTION 'the store policy row cannot be deleted; change it with adk-pg policy set'
            USING ERRCODE = 'restrict_violation';
    END IF;
    NEW.updated_at := pg_catalog.now();
    NEW.updated_by := current_user;
    INSERT INTO adk_store_policy_changes (before, after)
    VALUES (pg_catalog.to_jsonb(OLD) OPERATOR(pg_catalog.-) 'id'::text,
            pg_catalog.to_jsonb(NEW) OPERATOR(pg_catalog.-) 'id'::text);
    RETURN NEW;
END;
$$;

DROP FUNCTION adk_enter_tenant(text);

-- No function resolves a name through a search_path its caller controls.
-- A function with an SQL-standard body (BEGIN ATOMIC or RETURN) had every
-- name bound when it was created, so the path it runs under does not
-- matter, and without a SET clause the planner can inline it (a SET
-- switches search_path twice on every call). Every other function gets the
-- path pinned. None is callable by PUBLIC but the two that row-level
-- security evaluates as the querying role (they answer only about that
-- role).
DO $$
DECLARE
    f      regprocedure;
    pinned boolean;
BEGIN
    FOR f, pinned IN SELECT p.oid::regprocedure, p.prosqlbody IS NULL FROM pg_proc p
                     WHERE p.pronamespace = pg_catalog.current_schema()::regnamespace
                       AND p.proname LIKE 'adk\_%' LOOP
        IF pinned THEN
            EXECUTE pg_catalog.format('ALTER FUNCTION %s SET search_path = pg_catalog, %I, pg_temp',
                                      f, pg_catalog.current_schema());
        ELSE
            EXECUTE pg_catalog.format('ALTER FUNCTION %s RESET search_path', f);
        END IF;
        EXECUTE pg_catalog.format('REVOKE EXECUTE ON FUNCTION %s FROM PUBLIC', f);
    END LOOP;
END;
$$;
GRANT EXECUTE ON FUNCTION adk_acting_app() TO PUBLIC;
