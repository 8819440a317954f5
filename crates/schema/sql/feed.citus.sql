-- The feed's read on Citus: one server keeps one generic plan of it
-- (feed.sql); Citus cannot make one ("could not create distributed plan"),
-- so there it is planned with its arguments on every call, still with
-- sequential scans off.

ALTER FUNCTION adk_read_events_after(text, text, text, text, bigint, integer) SET plan_cache_mode = force_custom_plan;
