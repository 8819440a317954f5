SET lock_timeout = '5s';
-- The functions blobs.sql and append.sql made are dropped once every
-- migration is reverted (schema::replaceable::FILES_ONLY); the trigger and
-- the fifteen-argument append go now, with what they stand on.
DROP TRIGGER IF EXISTS adk_events_release_blobs ON adk_events;
DROP FUNCTION IF EXISTS adk_append_event(text, text, text, text, text, text, text, bigint, jsonb, jsonb, jsonb, jsonb, bigint, interval, bytea[]);
ALTER TABLE adk_events DROP COLUMN blob_refs;
DROP TABLE adk_blobs;
-- Migration 18's down.sql edits the fourteen-argument append: put its
-- signature back, as a placeholder the files restate.
CREATE FUNCTION adk_append_event(p_tenant text, p_app_name text, p_user_id text, p_session_id text, p_event_id text, p_invocation_id text, p_author text, p_event_ts bigint, p_payload jsonb, p_session_delta jsonb, p_user_delta jsonb, p_app_delta jsonb, p_expected_seq bigint, p_max_lifetime interval)
 RETURNS TABLE(outcome text, seq bigint, session_day date, updated_at timestamp with time zone, payload jsonb, successor_id text, max_lifetime interval)
 LANGUAGE plpgsql
AS $$ BEGIN RAISE EXCEPTION 'adk_append_event is stated by crates/schema/sql/append.sql'; END $$;
REVOKE EXECUTE ON FUNCTION adk_append_event(text, text, text, text, text, text, text, bigint, jsonb, jsonb, jsonb, jsonb, bigint, interval) FROM PUBLIC;
