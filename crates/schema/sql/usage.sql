-- Usage analytics: what an event's payload says about tokens, cost, kind
-- and span, and the partitions of the minute, hour and day rollups.
--
-- Installed after every migrate, in one transaction with the other files
-- (crates/schema/src/replaceable.rs). Each function is stated whole, with
-- its SET clauses and grants: change it here, not in a migration.

-- What an event counts as, read from its stored payload: an error (it has
-- an error_code), a tool result (a function response part), a tool call (a
-- function call part: adk-rust writes {name, args}, Gemini JSON
-- function_call or functionCall), a user message (author `user`), else a
-- model response. The rollup job and any check of it share this one rule.
-- A redacted event's tombstone (redact.sql) no longer has the parts the
-- kind is read from; it records the kind its original had.
CREATE OR REPLACE FUNCTION adk_usage_kind(p_payload jsonb, p_author text) RETURNS text
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
    RETURN CASE
        WHEN p_payload->'redaction'->'usage'->>'kind' IS NOT NULL THEN p_payload->'redaction'->'usage'->>'kind'
        WHEN p_payload->>'error_code' IS NOT NULL THEN 'error'
        WHEN jsonb_path_exists(p_payload,
             '$.content.parts[*] ? (exists(@.functionResponse) || exists(@.function_response))') THEN 'tool_result'
        WHEN jsonb_path_exists(p_payload,
             '$.content.parts[*] ? (exists(@.args) || exists(@.function_call) || exists(@.functionCall))') THEN 'tool_call'
        WHEN p_author = 'user' THEN 'user_message'
        ELSE 'model_response'
    END;
REVOKE EXECUTE ON FUNCTION adk_usage_kind(p_payload jsonb, p_author text) FROM PUBLIC;

-- The rollup's events query calls adk_usage_tokens three times per event.
-- Written with a sub-select, it could not be inlined and ran as a subplan
-- per call, about half of the query's time; as one expression the planner
-- inlines it. Same results (the exactness tests compare every bucket).
CREATE OR REPLACE FUNCTION adk_usage_tokens(p_payload jsonb, p_snake text, p_camel text) RETURNS bigint
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
    RETURN CASE
        WHEN jsonb_typeof(coalesce(p_payload->'usage_metadata'->p_snake, p_payload->'usage_metadata'->p_camel)) = 'number'
         AND (coalesce(p_payload->'usage_metadata'->p_snake, p_payload->'usage_metadata'->p_camel)::text)::numeric
             BETWEEN 0 AND 9007199254740992
        THEN trunc((coalesce(p_payload->'usage_metadata'->p_snake, p_payload->'usage_metadata'->p_camel)::text)::numeric)::bigint
        ELSE 0
    END;
REVOKE EXECUTE ON FUNCTION adk_usage_tokens(p_payload jsonb, p_snake text, p_camel text) FROM PUBLIC;

-- An event's size as the rollup counts it: the bytes of its payload's
-- text, or, for a redacted event, those of the original, recorded in its
-- tombstone (redact.sql), so a redaction leaves the size figures as they
-- were whether the rollup ran before it or after.
CREATE OR REPLACE FUNCTION adk_usage_bytes(p_payload jsonb) RETURNS integer
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
    RETURN CASE
        WHEN jsonb_typeof(p_payload->'redaction'->'usage'->'payload_bytes') = 'number'
        THEN (p_payload->'redaction'->'usage'->>'payload_bytes')::integer
        ELSE octet_length(p_payload::text)
    END;
REVOKE EXECUTE ON FUNCTION adk_usage_bytes(p_payload jsonb) FROM PUBLIC;

-- usage_metadata.cost as an exact decimal, NULL when absent or not a
-- finite number.
CREATE OR REPLACE FUNCTION adk_usage_cost(p_payload jsonb) RETURNS numeric
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
    RETURN CASE WHEN jsonb_typeof(p_payload->'usage_metadata'->'cost') = 'number'
                THEN ((p_payload->'usage_metadata'->'cost')::text)::numeric END;
REVOKE EXECUTE ON FUNCTION adk_usage_cost(p_payload jsonb) FROM PUBLIC;

-- 5. Partitions: a day of minutes, a month of hours, a year of days, named
--    adk_usage_1m_pYYYYMMDD, adk_usage_1h_pYYYYMM, adk_usage_1d_pYYYY. All
--    arithmetic in UTC, so nothing depends on the server's TimeZone.
CREATE OR REPLACE FUNCTION adk_usage_span(p_level text) RETURNS text
    LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
    RETURN CASE p_level WHEN '1m' THEN 'day' WHEN '1h' THEN 'month' WHEN '1d' THEN 'year' END;
REVOKE EXECUTE ON FUNCTION adk_usage_span(p_level text) FROM PUBLIC;

CREATE OR REPLACE FUNCTION adk_usage_partition_name(p_level text, p_start timestamp) RETURNS text
    LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
    RETURN 'adk_usage_' || p_level || '_p' || to_char(p_start,
        CASE p_level WHEN '1m' THEN 'YYYYMMDD' WHEN '1h' THEN 'YYYYMM' ELSE 'YYYY' END);
REVOKE EXECUTE ON FUNCTION adk_usage_partition_name(p_level text, p_start timestamp without time zone) FROM PUBLIC;

-- Creates (and protects) the partition of `p_level` holding `p_bucket`
-- when missing; returns whether it did.
CREATE OR REPLACE FUNCTION adk_ensure_usage_partition(p_level text, p_bucket timestamptz) RETURNS boolean
LANGUAGE plpgsql STRICT
SET lock_timeout = '5s'
SET search_path = pg_catalog, :"store_schema", pg_temp
AS $$
DECLARE
    span   text := adk_usage_span(p_level);
    lo     timestamp;
    part   text;
    schema name;
BEGIN
    IF span IS NULL THEN
        RAISE EXCEPTION 'unknown usage level %', p_level USING ERRCODE = 'invalid_parameter_value';
    END IF;
    lo := date_trunc(span, p_bucket AT TIME ZONE 'UTC');
    part := adk_usage_partition_name(p_level, lo);
    SELECT n.nspname INTO schema
    FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
    WHERE c.oid = 'adk_usage_1m'::regclass;
    IF EXISTS (SELECT 1 FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
               WHERE c.relname = part AND n.nspname = schema) THEN
        RETURN false;
    END IF;
    EXECUTE format('CREATE TABLE %I.%I PARTITION OF %I.%I FOR VALUES FROM (%L) TO (%L)',
                   schema, part, schema, 'adk_usage_' || p_level,
                   to_char(lo, 'YYYY-MM-DD HH24:MI:SS') || '+00',
                   to_char(lo + ('1 ' || span)::interval, 'YYYY-MM-DD HH24:MI:SS') || '+00');
    PERFORM adk_protect_tenant_table(format('%I.%I', schema, part)::regclass);
    RETURN true;
END;
$$;
REVOKE EXECUTE ON FUNCTION adk_ensure_usage_partition(p_level text, p_bucket timestamp with time zone) FROM PUBLIC;

-- Premakes the partitions the rollup job will write next: minutes for
-- yesterday (late events) through today + the policy's premake days, this
-- month's and next month's hours, this year's and next year's days.
-- Returns how many it created. Maintenance calls it.
CREATE OR REPLACE FUNCTION adk_premake_usage_partitions() RETURNS integer
LANGUAGE plpgsql
SET search_path = pg_catalog, :"store_schema", pg_temp
AS $$
DECLARE
    now_utc timestamp := now() AT TIME ZONE 'UTC';
    ahead   integer;
    made    integer := 0;
    bucket  timestamptz;
BEGIN
    SELECT p.premake_days INTO ahead FROM adk_store_policy p;
    FOR offset_days IN -1 .. coalesce(ahead, 7) LOOP
        bucket := (date_trunc('day', now_utc) + make_interval(days => offset_days)) AT TIME ZONE 'UTC';
        IF adk_ensure_usage_partition('1m', bucket) THEN made := made + 1; END IF;
    END LOOP;
    FOR offset_months IN 0 .. 1 LOOP
        bucket := (date_trunc('month', now_utc) + make_interval(months => offset_months)) AT TIME ZONE 'UTC';
        IF adk_ensure_usage_partition('1h', bucket) THEN made := made + 1; END IF;
    END LOOP;
    FOR offset_years IN 0 .. 1 LOOP
        bucket := (date_trunc('year', now_utc) + make_interval(years => offset_years)) AT TIME ZONE 'UTC';
        IF adk_ensure_usage_partition('1d', bucket) THEN made := made + 1; END IF;
    END LOOP;
    RETURN made;
END;
$$;
REVOKE EXECUTE ON FUNCTION adk_premake_usage_partitions() FROM PUBLIC;

-- Drops every rollup partition whose whole span is older than its tier's
-- retention in the policy (NULL keeps the tier forever); returns the names
-- it dropped. A partition is one table: the drop frees its disk at once and
-- writes almost no WAL, as for events.
CREATE OR REPLACE FUNCTION adk_retire_usage_partitions() RETURNS SETOF text
LANGUAGE plpgsql
SET lock_timeout = '5s'
SET search_path = pg_catalog, :"store_schema", pg_temp
AS $$
DECLARE
    pol     adk_store_policy;
    lvl     text;
    keep    interval;
    part    record;
    lo      timestamp;
BEGIN
    SELECT * INTO pol FROM adk_store_policy;
    FOREACH lvl IN ARRAY ARRAY['1m', '1h', '1d'] LOOP
        keep := CASE lvl WHEN '1m' THEN pol.usage_minute_retention
                         WHEN '1h' THEN pol.usage_hour_retention
                         ELSE pol.usage_day_retention END;
        CONTINUE WHEN keep IS NULL;
        FOR part IN
            SELECT n.nspname AS schema, c.relname AS name
            FROM pg_inherits i
            JOIN pg_class c ON c.oid = i.inhrelid
            JOIN pg_namespace n ON n.oid = c.relnamespace
            WHERE i.inhparent = ('adk_usage_' || lvl)::regclass
            ORDER BY c.relname
        LOOP
            lo := to_timestamp(substring(part.name FROM length('adk_usage_' || lvl || '_p') + 1),
                               CASE lvl WHEN '1m' THEN 'YYYYMMDD' WHEN '1h' THEN 'YYYYMM' ELSE 'YYYY' END)
                  AT TIME ZONE 'UTC';
            IF (lo + ('1 ' || adk_usage_span(lvl))::interval) AT TIME ZONE 'UTC'
               <= now() - adk_policy_seconds(keep) THEN
                EXECUTE format('DROP TABLE %I.%I', part.schema, part.name);
                RETURN NEXT part.name;
            END IF;
        END LOOP;
    END LOOP;
END;
$$;
REVOKE EXECUTE ON FUNCTION adk_retire_usage_partitions() FROM PUBLIC;
