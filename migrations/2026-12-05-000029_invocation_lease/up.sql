-- One invocation at a time per session (issue 36, crates/domain/src/lease.rs):
-- the session row carries the lease its appends check and move, so taking,
-- renewing and releasing it are part of the append's own statement.
--
-- None of the columns is indexed, so an append that moves the lease stays a
-- HOT update. Nullable and a constant default: adding them rewrites nothing.
-- The rule that reads them is stated in crates/schema/sql/append.sql.

-- lock_timeout for this transaction by set_config, not SET LOCAL: on Citus
-- a SET LOCAL is replayed on the workers as the text of this whole file.
SELECT pg_catalog.set_config('lock_timeout', '5s', true);

ALTER TABLE adk_sessions ADD COLUMN lease_holder text;
ALTER TABLE adk_sessions ADD COLUMN lease_generation bigint NOT NULL DEFAULT 0;
ALTER TABLE adk_sessions ADD COLUMN lease_until timestamptz;

-- The append gains the lease's three arguments (defaulted, so a binary of
-- the previous release, which passes fifteen, resolves to the new one during
-- a rolling deploy) and three result columns. A function can change neither
-- in place, so the old one (made by the files of an earlier release, absent
-- on a fresh install) goes here; append.sql states and grants the new.
DROP FUNCTION IF EXISTS adk_append_event(text, text, text, text, text, text, text, bigint, jsonb, jsonb, jsonb, jsonb, bigint, interval, bytea[]);
