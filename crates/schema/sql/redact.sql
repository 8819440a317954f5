-- Redacting one event (SessionStore::redact_event): its content, and every
-- other field that can carry text, replaced in place by a tombstone that
-- keeps the conversation's shape. What is kept is said once, in
-- crates/domain/src/redaction.rs, which states the same tombstone for the
-- in-memory store; the conformance suite holds the two to the same JSON.
--
-- Installed after every migrate, in one transaction with the other files
-- (crates/schema/src/replaceable.rs). Each function is stated whole, with
-- its SET clauses and grants: change it here, not in a migration.

-- Outcomes: 'redacted' (with the event's seq and new payload), 'already'
-- (redacted before, and this call would remove nothing more: nothing
-- written, the stored tombstone returned), 'not_found' (no live session),
-- 'no_event' (no event with that id in the session). A write: a role that
-- may not act for the app is refused with 42501 and nothing is written.
--
-- The session row is locked as an append locks it (FOR NO KEY UPDATE), so
-- a redaction and the appends of the session take turns: none is lost and
-- seq stays gapless, and a rewind cannot delete the event between the read
-- and the update. The event is read and updated by its unique
-- (…, session_day, event_id) key, on the session's one partition; its seq,
-- event_ts, created_at, author and invocation id columns stay, so the
-- rollup, which finds events by created_at, never counts it again.
--
-- The rollup reads the kind of an event from its content (tool call or
-- result) and its size from the whole payload; neither survives the
-- tombstone, so both are recorded in it (redaction.usage), as the rollup
-- would have read them from the original, and usage.sql reads them back
-- (adk_usage_kind, adk_usage_bytes). A second redaction keeps the first
-- one's figures. usage_metadata and error_code, which the rollup reads
-- directly, are kept.
--
-- Plain statements of one row each, routed by the user on Citus, where the
-- function is distributed with the sessions: no subquery touches a table
-- except by the function's own arguments.
CREATE OR REPLACE FUNCTION adk_redact_event(
    p_tenant      text,
    p_app_name    text,
    p_user_id     text,
    p_session_id  text,
    p_event_id    text,
    p_reason      text,
    p_state_delta boolean
) RETURNS TABLE (outcome text, seq bigint, payload jsonb)
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, :"store_schema", pg_temp
AS $$
#variable_conflict use_column
DECLARE
    s         record;
    ev        record;
    prior     jsonb;
    strip     boolean;
    at        timestamptz := pg_catalog.now();
    kept      jsonb;
    actions   jsonb;
    content   jsonb;
    tombstone jsonb;
BEGIN
    IF NOT adk_tenant_allows(p_tenant, p_app_name) THEN
        PERFORM adk_tenant_require(p_tenant, p_app_name);
    END IF;
    SELECT a.session_day, a.expires_at INTO s
      FROM adk_sessions a
     WHERE a.app_name = p_app_name AND a.user_id = p_user_id AND a.session_id = p_session_id
       FOR NO KEY UPDATE;
    IF NOT FOUND OR (s.expires_at IS NOT NULL AND s.expires_at <= pg_catalog.now()) THEN
        RETURN QUERY SELECT 'not_found'::text, NULL::bigint, NULL::jsonb;
        RETURN;
    END IF;
    SELECT e.seq, e.author, e.payload, e.blob_refs INTO ev
      FROM adk_events e
     WHERE e.app_name = p_app_name AND e.user_id = p_user_id AND e.session_id = p_session_id
       AND e.session_day = s.session_day AND e.event_id = p_event_id;
    IF NOT FOUND THEN
        RETURN QUERY SELECT 'no_event'::text, NULL::bigint, NULL::jsonb;
        RETURN;
    END IF;

    prior := ev.payload -> 'redaction';
    strip := coalesce(p_state_delta, false) OR coalesce((prior ->> 'state_delta')::boolean, false);
    IF prior IS NOT NULL AND (NOT coalesce(p_state_delta, false) OR coalesce((prior ->> 'state_delta')::boolean, false)) THEN
        RETURN QUERY SELECT 'already'::text, ev.seq, ev.payload;
        RETURN;
    END IF;

    SELECT coalesce(pg_catalog.jsonb_object_agg(k.key, k.value), '{}'::jsonb) INTO kept
      FROM pg_catalog.jsonb_each(ev.payload) k
     WHERE k.key IN ('id', 'invocation_id', 'author', 'timestamp', 'branch', 'partial', 'turn_complete',
                     'usage_metadata', 'error_code');
    SELECT coalesce(pg_catalog.jsonb_object_agg(k.key, k.value), '{}'::jsonb) INTO actions
      FROM pg_catalog.jsonb_each(coalesce(ev.payload -> 'actions', '{}'::jsonb)) k
     WHERE k.key IN ('transfer_to_agent', 'escalate', 'skip_summarization');
    actions := actions || pg_catalog.jsonb_build_object('state_delta',
        CASE WHEN strip THEN '{}'::jsonb ELSE coalesce(ev.payload -> 'actions' -> 'state_delta', '{}'::jsonb) END);
    IF pg_catalog.jsonb_typeof(ev.payload -> 'content') <> 'null' THEN
        content := pg_catalog.jsonb_build_object(
            'role', CASE WHEN pg_catalog.jsonb_typeof(ev.payload -> 'content' -> 'role') = 'string'
                         THEN ev.payload -> 'content' -> 'role'
                         WHEN ev.payload ->> 'author' = 'user' THEN '"user"'::jsonb
                         ELSE '"model"'::jsonb END,
            'parts', '[{"text": "[redacted]"}]'::jsonb);
        kept := kept || pg_catalog.jsonb_build_object('content', content);
    END IF;
    tombstone := kept || pg_catalog.jsonb_build_object(
        'actions', actions,
        'redaction', pg_catalog.jsonb_build_object(
            'reason', p_reason,
            -- RFC 3339 in UTC, whatever the server's TimeZone.
            'redacted_at', pg_catalog.to_char(at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"'),
            'state_delta', strip,
            'usage', coalesce(prior -> 'usage', pg_catalog.jsonb_build_object(
                'kind', adk_usage_kind(ev.payload, ev.author),
                'payload_bytes', pg_catalog.octet_length(ev.payload::text)))));

    -- The tombstone names no media: the event's blobs lose its reference
    -- (blobs.sql), so a redacted image goes unless another event names it.
    UPDATE adk_events e
       SET payload = tombstone, blob_refs = NULL
     WHERE e.app_name = p_app_name AND e.user_id = p_user_id AND e.session_id = p_session_id
       AND e.session_day = s.session_day AND e.seq = ev.seq;
    IF ev.blob_refs IS NOT NULL THEN
        PERFORM adk_release_blob_refs(p_app_name, ev.blob_refs);
    END IF;
    INSERT INTO adk_event_redactions (app_name, user_id, session_id, event_id, seq, reason, state_delta,
                                      redacted_at, redacted_by)
    VALUES (p_app_name, p_user_id, p_session_id, p_event_id, ev.seq, p_reason, strip, at, adk_acting_role_name());
    -- Ids and the seq only, never content, as every notice of the feed; sent
    -- only while the feed is on, as its triggers are. On Citus this runs on
    -- the user's worker, which has neither the feed's switch nor its
    -- listeners (docs/citus.md): no notice.
    IF NOT adk_on_citus() THEN
        IF adk_change_feed_enabled() THEN
            PERFORM pg_catalog.pg_notify(adk_feed_channel(p_app_name),
                                         pg_catalog.json_build_array('t', p_user_id, p_session_id, ev.seq)::text);
        END IF;
    END IF;
    RETURN QUERY SELECT 'redacted'::text, ev.seq, tombstone;
END;
$$;
REVOKE EXECUTE ON FUNCTION adk_redact_event(p_tenant text, p_app_name text, p_user_id text, p_session_id text, p_event_id text, p_reason text, p_state_delta boolean) FROM PUBLIC;

-- Every role that may append may redact, without re-running its setup
-- (adk-pg service-role grants it too).
SELECT adk_grant_like('adk_redact_event(text, text, text, text, text, text, boolean)', 'adk_append_event(text, text, text, text, text, text, text, bigint, jsonb, jsonb, jsonb, jsonb, bigint, interval, bytea[], interval, bigint, boolean)');
