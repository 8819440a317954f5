-- Redacting one event (SessionStore::redact_event): the event's content and
-- every other field that can carry text are replaced by a tombstone in
-- place (crates/schema/sql/redact.sql). This table is the audit of each
-- redaction: which event, why, when and by which role, never what was
-- removed.
--
-- Keyed like the log (app, user, session) so that on Citus it is
-- distributed by user_id and colocated with the sessions, and the redaction
-- function, which takes the user, writes it on the worker that holds the
-- user. No foreign key to the session: the audit outlives the session it
-- is about (a delete, an expiry, a retired day). An erasure of the user
-- deletes it with the rest of the user's rows.

SET LOCAL lock_timeout = '5s';

CREATE TABLE adk_event_redactions (
    app_name     text        NOT NULL,
    user_id      text        NOT NULL,
    session_id   text        NOT NULL,
    event_id     text        NOT NULL,
    seq          bigint      NOT NULL,
    reason       text        NOT NULL,
    -- Whether the state delta was removed too (rewind and fork then rebuild
    -- state without it).
    state_delta  boolean     NOT NULL,
    redacted_at  timestamptz NOT NULL DEFAULT pg_catalog.now(),
    -- The acting role (the SET ROLE target, else the login role), by name.
    redacted_by  name        NOT NULL,
    CONSTRAINT adk_event_redactions_pkey PRIMARY KEY (app_name, user_id, session_id, event_id, redacted_at),
    CONSTRAINT adk_event_redactions_reason_sane CHECK (
        pg_catalog.char_length(reason) BETWEEN 1 AND 256
        AND reason ~ '[^[:space:]]'
        AND reason !~ '[\u0001-\u001f\u007f-\u009f]'),
    CONSTRAINT adk_event_redactions_seq_positive CHECK (seq >= 1)
);

SELECT adk_protect_tenant_table('adk_event_redactions');
