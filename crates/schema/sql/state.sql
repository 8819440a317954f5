-- User and app state read and merged directly, without a session
-- (SessionStore::get_user_state, get_app_state, merge_user_state,
-- merge_app_state).
--
-- Installed after every migrate, in one transaction with the other files
-- (crates/schema/src/replaceable.rs). Each function is stated whole, with
-- its SET clauses and grants: change it here, not in a migration.
--
-- A merge is the append's shared-state step on its own (append.sql): the
-- same INSERT … ON CONFLICT … DO UPDATE SET state = u.state ||
-- EXCLUDED.state, so it takes the same row lock on the same row, and an
-- append and a merge racing on one user (or app) each see the other's keys:
-- no lost update either way. A merge takes that one lock and no other, so
-- it cannot deadlock with an append (which takes the session row first).
-- An empty delta writes nothing, as in the append. The delta's keys are
-- checked by the client as an append's are (crates/domain/src/state.rs,
-- check_scope_delta); the table's CHECKs bound the merged size and shape.
--
-- Every function runs the tenant check first and refuses (42501) a role
-- that may not act for the app, reads included: a session read answers
-- "not found" for another tenant's session, but a state read has no such
-- answer ({} is a state), and an empty state must not be mistaken for the
-- real one.
--
-- Session state has no such setter: it is written by events only, so that
-- rewind and fork rebuild it from the stored deltas (sessions.sql).
--
-- On Citus the user functions take p_user_id and are distributed with the
-- sessions (crates/schema/src/citus.rs), so each runs on the worker holding
-- the user's adk_user_states shard; the app functions stay on the
-- coordinator and write the reference table adk_app_states there.

CREATE OR REPLACE FUNCTION adk_get_user_state(p_tenant text, p_app_name text, p_user_id text)
 RETURNS TABLE(state jsonb)
 LANGUAGE plpgsql
 STABLE SECURITY DEFINER
 SET search_path = pg_catalog, :"store_schema", pg_temp
AS $$
#variable_conflict use_column
DECLARE
    stored jsonb;
BEGIN
    IF NOT adk_tenant_allows(p_tenant, p_app_name) THEN
        PERFORM adk_tenant_require(p_tenant, p_app_name);
    END IF;
    SELECT us.state INTO stored FROM adk_user_states us WHERE us.app_name = p_app_name AND us.user_id = p_user_id;
    RETURN QUERY SELECT coalesce(stored, '{}'::jsonb);
END;
$$;
REVOKE EXECUTE ON FUNCTION adk_get_user_state(p_tenant text, p_app_name text, p_user_id text) FROM PUBLIC;
SELECT adk_grant_like('adk_get_user_state(text, text, text)', 'adk_get_session(text, text, text, text, bigint, bigint)');

CREATE OR REPLACE FUNCTION adk_get_app_state(p_tenant text, p_app_name text)
 RETURNS TABLE(state jsonb)
 LANGUAGE plpgsql
 STABLE SECURITY DEFINER
 SET search_path = pg_catalog, :"store_schema", pg_temp
AS $$
#variable_conflict use_column
DECLARE
    stored jsonb;
BEGIN
    IF NOT adk_tenant_allows(p_tenant, p_app_name) THEN
        PERFORM adk_tenant_require(p_tenant, p_app_name);
    END IF;
    SELECT aps.state INTO stored FROM adk_app_states aps WHERE aps.app_name = p_app_name;
    RETURN QUERY SELECT coalesce(stored, '{}'::jsonb);
END;
$$;
REVOKE EXECUTE ON FUNCTION adk_get_app_state(p_tenant text, p_app_name text) FROM PUBLIC;
SELECT adk_grant_like('adk_get_app_state(text, text)', 'adk_get_session(text, text, text, text, bigint, bigint)');

-- The state after the merge comes back from the statement that wrote it
-- (RETURNING), under the row lock: no second read, no window.
CREATE OR REPLACE FUNCTION adk_merge_user_state(p_tenant text, p_app_name text, p_user_id text, p_delta jsonb)
 RETURNS TABLE(state jsonb)
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path = pg_catalog, :"store_schema", pg_temp
AS $$
#variable_conflict use_column
DECLARE
    merged jsonb;
BEGIN
    IF NOT adk_tenant_allows(p_tenant, p_app_name) THEN
        PERFORM adk_tenant_require(p_tenant, p_app_name);
    END IF;
    IF p_delta IS NOT NULL AND p_delta <> '{}'::jsonb THEN
        INSERT INTO adk_user_states AS u (app_name, user_id, state)
        VALUES (p_app_name, p_user_id, p_delta)
        ON CONFLICT (app_name, user_id)
        DO UPDATE SET state = u.state || EXCLUDED.state, updated_at = EXCLUDED.updated_at
        RETURNING u.state INTO merged;
    ELSE
        SELECT us.state INTO merged FROM adk_user_states us
         WHERE us.app_name = p_app_name AND us.user_id = p_user_id;
    END IF;
    RETURN QUERY SELECT coalesce(merged, '{}'::jsonb);
END;
$$;
REVOKE EXECUTE ON FUNCTION adk_merge_user_state(p_tenant text, p_app_name text, p_user_id text, p_delta jsonb) FROM PUBLIC;
SELECT adk_grant_like('adk_merge_user_state(text, text, text, jsonb)', 'adk_append_event(text, text, text, text, text, text, text, bigint, jsonb, jsonb, jsonb, jsonb, bigint, interval, bytea[], interval, bigint, boolean)');

CREATE OR REPLACE FUNCTION adk_merge_app_state(p_tenant text, p_app_name text, p_delta jsonb)
 RETURNS TABLE(state jsonb)
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path = pg_catalog, :"store_schema", pg_temp
AS $$
#variable_conflict use_column
DECLARE
    merged jsonb;
BEGIN
    IF NOT adk_tenant_allows(p_tenant, p_app_name) THEN
        PERFORM adk_tenant_require(p_tenant, p_app_name);
    END IF;
    IF p_delta IS NOT NULL AND p_delta <> '{}'::jsonb THEN
        INSERT INTO adk_app_states AS a (app_name, state)
        VALUES (p_app_name, p_delta)
        ON CONFLICT (app_name)
        DO UPDATE SET state = a.state || EXCLUDED.state, updated_at = EXCLUDED.updated_at
        RETURNING a.state INTO merged;
    ELSE
        SELECT aps.state INTO merged FROM adk_app_states aps WHERE aps.app_name = p_app_name;
    END IF;
    RETURN QUERY SELECT coalesce(merged, '{}'::jsonb);
END;
$$;
REVOKE EXECUTE ON FUNCTION adk_merge_app_state(p_tenant text, p_app_name text, p_delta jsonb) FROM PUBLIC;
SELECT adk_grant_like('adk_merge_app_state(text, text, jsonb)', 'adk_append_event(text, text, text, text, text, text, text, bigint, jsonb, jsonb, jsonb, jsonb, bigint, interval, bytea[], interval, bigint, boolean)');
