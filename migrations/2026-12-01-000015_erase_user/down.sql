-- Erasure gone: its functions, then its audit table. Sessions an
-- interrupted erasure had hidden stay expired; expiry removes them.
DROP FUNCTION adk_erase_user_preview(text, text, text);
DROP FUNCTION adk_erase_user_batch(text, text, text, bigint, integer);
DROP FUNCTION adk_erase_user_begin(text, text, text);
DROP FUNCTION adk_erase_user_check(text, text);
DROP FUNCTION adk_acting_role_name();
DROP FUNCTION adk_user_hash(text);
DROP TABLE adk_user_erasures;
