SELECT pg_catalog.set_config('lock_timeout', '5s', true);
DROP FUNCTION IF EXISTS adk_append_event(text, text, text, text, text, text, text, bigint, jsonb, jsonb, jsonb, jsonb, bigint, interval, bytea[], interval, bigint, boolean);
ALTER TABLE adk_sessions DROP COLUMN lease_until;
ALTER TABLE adk_sessions DROP COLUMN lease_generation;
ALTER TABLE adk_sessions DROP COLUMN lease_holder;
-- Migration 26's down.sql drops the fifteen-argument append: put its
-- signature back, as a placeholder the files restate.
CREATE FUNCTION adk_append_event(p_tenant text, p_app_name text, p_user_id text, p_session_id text, p_event_id text, p_invocation_id text, p_author text, p_event_ts bigint, p_payload jsonb, p_session_delta jsonb, p_user_delta jsonb, p_app_delta jsonb, p_expected_seq bigint, p_max_lifetime interval, p_blobs bytea[] DEFAULT NULL)
 RETURNS TABLE(outcome text, seq bigint, session_day date, updated_at timestamp with time zone, payload jsonb, successor_id text, max_lifetime interval)
 LANGUAGE plpgsql
AS $$ BEGIN RAISE EXCEPTION 'adk_append_event is stated by crates/schema/sql/append.sql'; END $$;
REVOKE EXECUTE ON FUNCTION adk_append_event(text, text, text, text, text, text, text, bigint, jsonb, jsonb, jsonb, jsonb, bigint, interval, bytea[]) FROM PUBLIC;
