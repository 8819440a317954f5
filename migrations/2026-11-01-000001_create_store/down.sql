DROP FUNCTION IF EXISTS adk_ensure_event_partition(date);
DROP FUNCTION IF EXISTS adk_event_partition_name(date);
DROP TABLE IF EXISTS adk_events;
DROP TABLE IF EXISTS adk_sessions;
DROP TABLE IF EXISTS adk_user_states;
DROP TABLE IF EXISTS adk_app_states;
