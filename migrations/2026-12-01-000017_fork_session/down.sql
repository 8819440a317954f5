DROP FUNCTION adk_fork_session(text, text, text, text, text, bigint, interval);
