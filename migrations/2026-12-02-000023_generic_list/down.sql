SET LOCAL lock_timeout = '5s';

-- Back to migration 14's list, planned as the plan cache chooses.
ALTER FUNCTION adk_list_sessions(text, text, text, timestamp with time zone, text, bigint, jsonb, timestamp with time zone,
    timestamp with time zone)
    RESET plan_cache_mode;
ALTER FUNCTION adk_list_sessions(text, text, text, timestamp with time zone, text, bigint, jsonb, timestamp with time zone,
    timestamp with time zone)
    RESET enable_seqscan;
