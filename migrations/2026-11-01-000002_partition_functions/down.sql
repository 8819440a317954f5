DROP FUNCTION IF EXISTS adk_ensure_event_partition(date);
DROP FUNCTION IF EXISTS adk_event_partition_name(date);
