-- Listing an app's sessions across its users (SessionStore::list_app_sessions,
-- adk-pg sessions --app), newest created first, in keyset pages. The
-- function is stated in crates/schema/sql/read.sql; this is its index.
--
-- Ordered by created_at, never by updated_at: every append sets updated_at,
-- and an append must stay a HOT update, which it is only while no index
-- holds a column it changes. created_at, user_id and session_id never
-- change after insert, so this index keeps appends HOT (the test
-- appends_are_hot_updates holds to it). The page's order is the index's, so
-- a page reads its rows of the index and no more, however big the app.
--
-- Not CONCURRENTLY: the migrations run in a transaction (a CREATE INDEX
-- CONCURRENTLY cannot), as every earlier index of adk_sessions was built
-- (migrations 6 and 14). The build holds a SHARE lock on adk_sessions, so
-- creates and appends wait for it: on a table of a few million sessions,
-- seconds. An operator of a larger store builds it first, outside the
-- migration and without blocking writes:
--   CREATE INDEX CONCURRENTLY adk_sessions_app_created
--       ON adk_sessions (app_name, created_at DESC, user_id DESC, session_id DESC);
-- and this migration then finds it and builds nothing (check that it is
-- valid: a concurrent build that failed leaves an INVALID index behind;
-- drop it and build again). On Citus the statement goes on to every shard
-- of adk_sessions, in this transaction.

-- lock_timeout for this transaction by set_config, not SET LOCAL: on Citus
-- (citus.propagate_set_commands = local) a SET LOCAL is replayed on the
-- workers as the text of the whole query it came in, which is this file.
SELECT pg_catalog.set_config('lock_timeout', '5s', true);

CREATE INDEX IF NOT EXISTS adk_sessions_app_created
    ON adk_sessions (app_name, created_at DESC, user_id DESC, session_id DESC);
