-- The reads on Citus. One server keeps one generic plan of the get's event
-- read and of the list's page (read.sql); Citus cannot make one ("could not
-- create distributed plan"), so there they are planned with their
-- arguments on every call, still with sequential scans off.

ALTER FUNCTION adk_read_session(text, text, text, text, bigint, bigint) SET plan_cache_mode = force_custom_plan;
ALTER FUNCTION adk_read_sessions(text, text, text, timestamp with time zone, text, bigint, jsonb,
                                 timestamp with time zone, timestamp with time zone)
    SET plan_cache_mode = force_custom_plan;
ALTER FUNCTION adk_list_events(text, text, text, text, bigint, bigint, bigint) SET plan_cache_mode = force_custom_plan;
ALTER FUNCTION adk_list_app_sessions(text, text, timestamp with time zone, text, text, bigint, jsonb,
                                     timestamp with time zone, timestamp with time zone)
    SET plan_cache_mode = force_custom_plan;
