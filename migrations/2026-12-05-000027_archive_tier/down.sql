SET lock_timeout = '5s';
-- The functions archive.sql made are dropped once every migration is
-- reverted (schema::replaceable::FILES_ONLY). Restored schemas are the
-- operator's: they stay.
ALTER TABLE adk_user_erasures DROP COLUMN restored_rows, DROP COLUMN archived_rows;
DROP TABLE adk_archive_restores;
DROP TABLE adk_archive_failures;
DROP TABLE adk_archive_objects;
ALTER TABLE adk_store_policy
    DROP CONSTRAINT adk_store_policy_archive_format_known,
    DROP CONSTRAINT adk_store_policy_archive_apps_named,
    DROP CONSTRAINT adk_store_policy_archive_url_form,
    DROP COLUMN archive_format,
    DROP COLUMN archive_apps,
    DROP COLUMN archive_url;
