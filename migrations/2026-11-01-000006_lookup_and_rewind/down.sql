DROP FUNCTION IF EXISTS adk_rewind_session(text, text, text, text, bigint, bigint);
DROP FUNCTION IF EXISTS adk_find_sessions(text, text, integer);
DROP INDEX IF EXISTS adk_sessions_session_id;
