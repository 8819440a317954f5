DROP FUNCTION adk_usage_cost(jsonb);
DROP FUNCTION adk_usage_tokens(jsonb, text, text);
DROP FUNCTION adk_usage_kind(jsonb, text);
DROP FUNCTION adk_retire_usage_partitions();
DROP FUNCTION adk_premake_usage_partitions();
DROP FUNCTION adk_ensure_usage_partition(text, timestamptz);
DROP FUNCTION adk_usage_partition_name(text, timestamp);
DROP FUNCTION adk_usage_span(text);
DROP TABLE adk_usage_runs;
DROP TABLE adk_usage_late_events;
DROP TABLE adk_usage_invocation_tails;
DROP TABLE adk_usage_state;
DROP TABLE adk_usage_1d;
DROP TABLE adk_usage_1h;
DROP TABLE adk_usage_1m;
ALTER TABLE adk_store_policy
    DROP CONSTRAINT adk_store_policy_day_tier_covers_hours,
    DROP CONSTRAINT adk_store_policy_hour_tier_covers_minutes,
    DROP CONSTRAINT adk_store_policy_minute_tier_covers_lateness,
    DROP CONSTRAINT adk_store_policy_usage_lateness_range,
    DROP COLUMN usage_day_retention,
    DROP COLUMN usage_hour_retention,
    DROP COLUMN usage_minute_retention,
    DROP COLUMN usage_lateness;
DROP INDEX adk_events_created_at_brin;
ALTER TABLE adk_events ALTER COLUMN created_at SET DEFAULT now();
