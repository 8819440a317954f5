-- The change feed gone: its triggers first (they depend on the notify
-- functions), then its functions.
SELECT adk_set_change_feed(false);
DROP FUNCTION adk_read_events_after(text, text, text, text, bigint, integer);
DROP FUNCTION adk_feed_listen(text, text);
DROP FUNCTION adk_set_change_feed(boolean);
DROP FUNCTION adk_change_feed_enabled();
DROP FUNCTION adk_feed_session_notify();
DROP FUNCTION adk_feed_event_notify();
DROP FUNCTION adk_feed_channel(text);
