-- The archive tier (crates/archive): before maintenance drops a day, each
-- app's events of it are written as Parquet to object storage, read back,
-- verified and recorded here; only then does the day go.
--
-- The policy says where and for which apps. The destination is a URL, never
-- a credential: an s3:// store's keys come from the environment of the
-- process that archives. Turning archiving on archives from then on (days
-- already dropped are gone), and the policy's change log records when.

SET lock_timeout = '5s';

ALTER TABLE adk_store_policy
    -- NULL: archiving is off, and a day past retention is dropped unarchived.
    ADD COLUMN archive_url    text,
    -- NULL: every app; else only these apps' events are archived.
    ADD COLUMN archive_apps   text[],
    ADD COLUMN archive_format integer NOT NULL DEFAULT 1,
    ADD CONSTRAINT adk_store_policy_archive_url_form
        CHECK (archive_url IS NULL OR archive_url ~ '^(file:///[^?#]+|s3://[^/?#@:]+(/[^?#]*)?)$'),
    ADD CONSTRAINT adk_store_policy_archive_apps_named
        CHECK (archive_apps IS NULL OR (pg_catalog.cardinality(archive_apps) > 0
                                        AND pg_catalog.array_position(archive_apps, NULL) IS NULL)),
    ADD CONSTRAINT adk_store_policy_archive_format_known CHECK (archive_format = 1);

-- The catalog: every object an archived day consists of, as written and
-- read back. A day's rows are replaced together, in one transaction, once
-- all of its objects verified, so a day is either wholly recorded or not.
CREATE TABLE adk_archive_objects (
    app_name       text        NOT NULL,
    day            date        NOT NULL,
    kind           text        NOT NULL,
    part           integer     NOT NULL,
    object_key     text        NOT NULL,
    -- The policy's URL when it was written; the key is relative to it.
    destination    text        NOT NULL,
    rows           bigint      NOT NULL,
    bytes          bigint      NOT NULL,
    sha256         bytea       NOT NULL,
    format_version integer     NOT NULL,
    -- Events the day held for the app when it was archived; the objects'
    -- rows add up to it.
    day_events     bigint      NOT NULL,
    archived_at    timestamptz NOT NULL DEFAULT pg_catalog.now(),
    archived_by    name        NOT NULL DEFAULT current_user,
    verified_at    timestamptz NOT NULL DEFAULT pg_catalog.now(),
    CONSTRAINT adk_archive_objects_pkey PRIMARY KEY (app_name, day, kind, part),
    CONSTRAINT adk_archive_objects_kind_known CHECK (kind IN ('events', 'media')),
    CONSTRAINT adk_archive_objects_counts CHECK (part >= 0 AND rows >= 0 AND bytes >= 0 AND day_events >= 0),
    CONSTRAINT adk_archive_objects_sha256_size CHECK (pg_catalog.length(sha256) = 32)
);
SELECT adk_protect_tenant_table('adk_archive_objects');

-- Why an app's day was not archived; the day stays in the database until a
-- later run archives it (resolved_at) and drops it.
CREATE TABLE adk_archive_failures (
    failure_id  bigint      GENERATED ALWAYS AS IDENTITY,
    app_name    text        NOT NULL,
    day         date        NOT NULL,
    failed_at   timestamptz NOT NULL DEFAULT pg_catalog.now(),
    error       text        NOT NULL,
    resolved_at timestamptz,
    CONSTRAINT adk_archive_failures_pkey PRIMARY KEY (failure_id)
);
CREATE INDEX adk_archive_failures_open ON adk_archive_failures (app_name, day) WHERE resolved_at IS NULL;
SELECT adk_protect_tenant_table('adk_archive_failures');

-- Days loaded back from the archive (`adk-pg archive restore`), each into a
-- read-only schema of its own choosing; an erasure reaches them through
-- this list.
CREATE TABLE adk_archive_restores (
    schema_name text        NOT NULL,
    app_name    text        NOT NULL,
    day         date        NOT NULL,
    rows        bigint      NOT NULL,
    restored_at timestamptz NOT NULL DEFAULT pg_catalog.now(),
    restored_by name        NOT NULL DEFAULT current_user,
    CONSTRAINT adk_archive_restores_pkey PRIMARY KEY (schema_name, app_name, day)
);
SELECT adk_protect_tenant_table('adk_archive_restores');

-- What an erasure removed beyond the live log: rows of archived objects,
-- and rows of restored copies.
ALTER TABLE adk_user_erasures
    ADD COLUMN archived_rows bigint NOT NULL DEFAULT 0,
    ADD COLUMN restored_rows bigint NOT NULL DEFAULT 0;
