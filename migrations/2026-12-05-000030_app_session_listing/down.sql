-- The app-wide listing's index. adk_list_app_sessions (crates/schema/sql/
-- read.sql) keeps working without it, reading the app's sessions by the
-- primary key and sorting them.
SELECT pg_catalog.set_config('lock_timeout', '5s', true);

DROP INDEX IF EXISTS adk_sessions_app_created;
