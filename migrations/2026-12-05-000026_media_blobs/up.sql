-- Media out of the log: large inline data of an event is stored once per
-- app, as raw bytes under its SHA-256, and the event keeps a reference
-- (crates/domain/src/blob.rs).
--
-- A blob is counted, not swept: refs is the number of events (each counted
-- once) whose blob_refs name it. The append that stores an event adds its
-- references; an AFTER DELETE trigger on adk_events removes them, so every
-- way an event leaves (delete, expiry, erasure, rewind, the rows maintenance
-- releases before it drops a day) keeps the count, and a blob leaves with
-- its last reference. The functions are stated in crates/schema/sql/blobs.sql;
-- this migration only makes what a table or a grant needs to exist first.

SET lock_timeout = '5s';

CREATE TABLE adk_blobs (
    app_name   text        NOT NULL,
    sha256     bytea       NOT NULL CHECK (length(sha256) = 32),
    size       bigint      NOT NULL CHECK (size >= 0),
    refs       bigint      NOT NULL CHECK (refs >= 0),
    created_at timestamptz NOT NULL DEFAULT now(),
    data       bytea       NOT NULL,
    PRIMARY KEY (app_name, sha256)
) WITH (fillfactor = 80);
-- Images and audio arrive compressed: storing them uncompressed, out of
-- line, costs no CPU for a gain pglz would not find, and keeps a blob's
-- bytes its own size.
ALTER TABLE adk_blobs ALTER COLUMN data SET STORAGE EXTERNAL;
SELECT adk_protect_tenant_table('adk_blobs');

-- NULL for an event without media, so the column costs a text event
-- nothing and adding it rewrites no partition.
ALTER TABLE adk_events ADD COLUMN blob_refs bytea[];

-- The trigger that counts a leaving event's blobs down, and the append's
-- new last argument (the event's media, with a default, so a binary of the
-- previous release, which passes fourteen, resolves to it during a rolling
-- deploy), are stated in crates/schema/sql/blobs.sql and append.sql. A
-- function cannot gain an argument in place, so the old one goes here;
-- append.sql grants the new one to the roles that run the store.
DROP FUNCTION adk_append_event(text, text, text, text, text, text, text, bigint, jsonb, jsonb, jsonb, jsonb, bigint, interval);
