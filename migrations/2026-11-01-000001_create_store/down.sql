DROP TABLE IF EXISTS adk_events;
DROP TABLE IF EXISTS adk_sessions;
DROP TABLE IF EXISTS adk_user_states;
DROP TABLE IF EXISTS adk_app_states;
