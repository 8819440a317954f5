DROP FUNCTION IF EXISTS adk_append_event(text, text, text, text, text, text, bigint, jsonb, jsonb, jsonb, jsonb, bigint, interval);
