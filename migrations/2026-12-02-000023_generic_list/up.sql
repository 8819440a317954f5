SET LOCAL lock_timeout = '5s';

-- The list's page read on one kept plan. Under the default plan_cache_mode
-- the plan cache found a custom plan cheaper than a generic one for this
-- statement and went on planning it on every call: with 20,000 sessions of
-- 200 users, pgbench medians of seven interleaved rounds listing a user's
-- 100 sessions: 2,467/s planned per call, 4,113/s on a kept plan, against
-- 5,223/s for a lean SELECT. The plan is made with sequential scans off, as
-- the get's (migration 20): a plan kept from when adk_sessions was small
-- would otherwise read the whole table on every list once it has grown.
-- The page with a label filter goes on through EXECUTE, planned with the
-- filter's value on every call whatever the setting (which of the user's
-- sessions carry the label decides between the label index and the key).
-- tests/tests/plan_cache.rs holds the list to one plan per connection, to
-- the key's index, and the filtered page to a plan made with its value.
-- On Citus the distribution step plans the list per call, as the get and
-- the feed. The body is unchanged: only its settings are.

ALTER FUNCTION adk_list_sessions(text, text, text, timestamp with time zone, text, bigint, jsonb, timestamp with time zone,
    timestamp with time zone)
    SET plan_cache_mode = force_generic_plan;
ALTER FUNCTION adk_list_sessions(text, text, text, timestamp with time zone, text, bigint, jsonb, timestamp with time zone,
    timestamp with time zone)
    SET enable_seqscan = off;
