-- The audit goes; redacted events stay redacted (their tombstones are
-- ordinary payloads). The function is dropped after the last migration is
-- reverted (schema::replaceable::FILES_ONLY).
SET LOCAL lock_timeout = '5s';

DROP TABLE adk_event_redactions;
