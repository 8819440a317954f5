DROP FUNCTION IF EXISTS adk_rollover_session(text, text, text, text, text, text, text, text, bigint, jsonb, interval);
DROP TABLE IF EXISTS adk_maintenance_runs;
