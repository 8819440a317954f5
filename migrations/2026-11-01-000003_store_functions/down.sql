DROP FUNCTION IF EXISTS adk_append_event(text, text, text, text, text, text, text, bigint, jsonb, jsonb, jsonb, jsonb, bigint, interval);
DROP FUNCTION IF EXISTS adk_delete_session(text, text, text, text);
DROP FUNCTION IF EXISTS adk_list_sessions(text, text, text, timestamptz, text, bigint);
DROP FUNCTION IF EXISTS adk_load_events(text, text, text, text, date, bigint, bigint, bigint);
DROP FUNCTION IF EXISTS adk_load_session(text, text, text, text);
DROP FUNCTION IF EXISTS adk_create_session(text, text, text, text, jsonb, interval, jsonb, jsonb);
DROP FUNCTION IF EXISTS adk_enter_tenant(text);
