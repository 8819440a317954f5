-- Usage analytics from the event log (docs/ARCHITECTURE.md, "Usage
-- rollups"): per (app, author, kind) and minute, hour and day, counts, sums,
-- min and max and mergeable sketches, written only by the rollup job
-- (crates/rollup) and never on the append path.

-- 1. Arrival time. The rollup job reads what arrived since its watermark by
--    created_at, so created_at must be taken while the inserting
--    transaction already holds its lock on adk_events: clock_timestamp() at
--    insert, not now() (the transaction's start, which may precede the
--    lock by a lock wait). The job waits for every transaction holding a
--    write lock on the log when it picks its upper bound; with this default
--    no row can later commit below that bound. Recurses to every partition.
ALTER TABLE adk_events ALTER COLUMN created_at SET DEFAULT clock_timestamp();

-- A BRIN index finds a window of arrival times in each partition without a
-- B-tree on the append path: rows arrive in created_at order, so each
-- block range summarises a narrow interval, and an insert into a range not
-- yet summarised costs nothing (autovacuum summarises it later).
CREATE INDEX adk_events_created_at_brin ON adk_events USING brin (created_at)
    WITH (pages_per_range = 32, autosummarize = on);

-- 2. Tiers and lateness, in the store's one policy row.
ALTER TABLE adk_store_policy
    ADD COLUMN usage_lateness         interval NOT NULL DEFAULT '24 hours',
    ADD COLUMN usage_minute_retention interval NOT NULL DEFAULT '14 days',
    ADD COLUMN usage_hour_retention   interval NOT NULL DEFAULT '400 days',
    ADD COLUMN usage_day_retention    interval,
    ADD CONSTRAINT adk_store_policy_usage_lateness_range
        CHECK (usage_lateness >= interval '1 minute' AND usage_lateness <= interval '7 days'),
    -- A late event recomputes its hour from the minute rows, and its day
    -- from the hour rows: both must still be there for the whole window
    -- (plus the day a partition spans).
    ADD CONSTRAINT adk_store_policy_minute_tier_covers_lateness
        CHECK (usage_minute_retention >= usage_lateness + interval '1 day'),
    ADD CONSTRAINT adk_store_policy_hour_tier_covers_minutes
        CHECK (usage_hour_retention >= usage_minute_retention),
    ADD CONSTRAINT adk_store_policy_day_tier_covers_hours
        CHECK (usage_day_retention IS NULL OR usage_day_retention >= usage_hour_retention);

-- What an event counts as, read from its stored payload: an error (it has
-- an error_code), a tool result (a function response part), a tool call (a
-- function call part: adk-rust writes {name, args}, Gemini JSON
-- function_call or functionCall), a user message (author `user`), else a
-- model response. The rollup job and any check of it share this one rule.
CREATE FUNCTION adk_usage_kind(p_payload jsonb, p_author text) RETURNS text
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
    RETURN CASE
        WHEN p_payload->>'error_code' IS NOT NULL THEN 'error'
        WHEN jsonb_path_exists(p_payload,
             '$.content.parts[*] ? (exists(@.functionResponse) || exists(@.function_response))') THEN 'tool_result'
        WHEN jsonb_path_exists(p_payload,
             '$.content.parts[*] ? (exists(@.args) || exists(@.function_call) || exists(@.functionCall))') THEN 'tool_call'
        WHEN p_author = 'user' THEN 'user_message'
        ELSE 'model_response'
    END;

-- A token count of usage_metadata (snake_case as adk-rust writes it, or
-- camelCase): a whole number from 0 to 2^53, else 0, so one malformed
-- event can never stop the rollup.
CREATE FUNCTION adk_usage_tokens(p_payload jsonb, p_snake text, p_camel text) RETURNS bigint
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
    RETURN (SELECT CASE WHEN jsonb_typeof(v) = 'number' AND (v::text)::numeric BETWEEN 0 AND 9007199254740992
                        THEN trunc((v::text)::numeric)::bigint ELSE 0 END
            FROM coalesce(p_payload->'usage_metadata'->p_snake, p_payload->'usage_metadata'->p_camel) AS v);

-- usage_metadata.cost as an exact decimal, NULL when absent or not a
-- finite number.
CREATE FUNCTION adk_usage_cost(p_payload jsonb) RETURNS numeric
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
    RETURN CASE WHEN jsonb_typeof(p_payload->'usage_metadata'->'cost') = 'number'
                THEN ((p_payload->'usage_metadata'->'cost')::text)::numeric END;

-- 3. The rollup levels. Same columns at every level; a level above the
--    minute is computed only from the level below. Sketches are versioned
--    bytea (encoding in crates/rollup/src/sketch.rs and ARCHITECTURE.md):
--    latency and payload size are DDSketches, sessions, users and folded
--    authors HyperLogLogs. Sums and counts, never averages.
CREATE TABLE adk_usage_1m (
    app_name          text             NOT NULL,
    -- The agent (or `user`). Authors above the per-app cap of a bucket are
    -- folded into one row per kind with folded = true and author ''.
    author            text             NOT NULL,
    folded            boolean          NOT NULL DEFAULT false,
    kind              text             NOT NULL,
    bucket_start      timestamptz      NOT NULL,
    events            bigint           NOT NULL,
    payload_bytes     bigint           NOT NULL,
    payload_bytes_min integer          NOT NULL,
    payload_bytes_max integer          NOT NULL,
    prompt_tokens     bigint           NOT NULL,
    candidates_tokens bigint           NOT NULL,
    total_tokens      bigint           NOT NULL,
    -- Exact decimal sum of usage_metadata.cost; NULL when no event had one.
    cost              numeric,
    cost_events       bigint           NOT NULL,
    errors            bigint           NOT NULL,
    latency_count     bigint           NOT NULL,
    latency_sketch    bytea            NOT NULL,
    size_sketch       bytea            NOT NULL,
    sessions_sketch   bytea            NOT NULL,
    users_sketch      bytea            NOT NULL,
    folded_authors    bytea,
    CONSTRAINT adk_usage_1m_pkey PRIMARY KEY (app_name, bucket_start, author, kind, folded),
    CONSTRAINT adk_usage_1m_kind_known
        CHECK (kind IN ('user_message', 'model_response', 'tool_call', 'tool_result', 'error')),
    CONSTRAINT adk_usage_1m_folded_row CHECK (NOT folded OR author = '')
) PARTITION BY RANGE (bucket_start);

CREATE TABLE adk_usage_1h (LIKE adk_usage_1m INCLUDING CONSTRAINTS INCLUDING DEFAULTS,
    CONSTRAINT adk_usage_1h_pkey PRIMARY KEY (app_name, bucket_start, author, kind, folded)
) PARTITION BY RANGE (bucket_start);

CREATE TABLE adk_usage_1d (LIKE adk_usage_1m INCLUDING CONSTRAINTS INCLUDING DEFAULTS,
    CONSTRAINT adk_usage_1d_pkey PRIMARY KEY (app_name, bucket_start, author, kind, folded)
) PARTITION BY RANGE (bucket_start);

-- 4. The job's own state. One row: the arrival time below which every
--    event has been rolled up (or rejected), and the session day below
--    which invocation tails were pruned (for those sessions the previous
--    event of an invocation is looked up in the log itself).
CREATE TABLE adk_usage_state (
    id                  boolean     NOT NULL DEFAULT true,
    watermark           timestamptz,
    tails_pruned_before date,
    updated_at          timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT adk_usage_state_pkey PRIMARY KEY (id),
    CONSTRAINT adk_usage_state_one_row CHECK (id)
);
INSERT INTO adk_usage_state DEFAULT VALUES;

-- The last event rolled up per invocation, so an event's latency (from the
-- previous event of its invocation) never needs a scan of its session.
CREATE TABLE adk_usage_invocation_tails (
    app_name      text   NOT NULL,
    user_id       text   NOT NULL,
    session_id    text   NOT NULL,
    session_day   date   NOT NULL,
    invocation_id text   NOT NULL,
    last_seq      bigint NOT NULL,
    last_event_ts bigint NOT NULL,
    CONSTRAINT adk_usage_invocation_tails_pkey
        PRIMARY KEY (app_name, user_id, session_id, session_day, invocation_id)
);
CREATE INDEX adk_usage_invocation_tails_day ON adk_usage_invocation_tails (session_day);

-- Events that arrived outside the lateness window, per app and UTC day of
-- arrival: never rolled up, counted here, alerted on by `adk-pg status`.
CREATE TABLE adk_usage_late_events (
    app_name      text        NOT NULL,
    arrival_day   date        NOT NULL,
    rejected      bigint      NOT NULL,
    last_event_ts bigint      NOT NULL,
    updated_at    timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT adk_usage_late_events_pkey PRIMARY KEY (app_name, arrival_day)
);

-- Every rollup run, successful or not.
CREATE TABLE adk_usage_runs (
    run_id          bigint      GENERATED ALWAYS AS IDENTITY,
    started_at      timestamptz NOT NULL,
    finished_at     timestamptz NOT NULL DEFAULT now(),
    window_from     timestamptz,
    window_to       timestamptz,
    events_read     bigint      NOT NULL DEFAULT 0,
    events_rolled   bigint      NOT NULL DEFAULT 0,
    late_rejected   bigint      NOT NULL DEFAULT 0,
    minute_buckets  integer     NOT NULL DEFAULT 0,
    hour_buckets    integer     NOT NULL DEFAULT 0,
    day_buckets     integer     NOT NULL DEFAULT 0,
    writers_waited  integer     NOT NULL DEFAULT 0,
    outcome         text        NOT NULL,
    error           text,
    CONSTRAINT adk_usage_runs_pkey PRIMARY KEY (run_id),
    CONSTRAINT adk_usage_runs_outcome_known CHECK (outcome IN ('ok', 'failed', 'waiting'))
);

-- 5. Partitions: a day of minutes, a month of hours, a year of days, named
--    adk_usage_1m_pYYYYMMDD, adk_usage_1h_pYYYYMM, adk_usage_1d_pYYYY. All
--    arithmetic in UTC, so nothing depends on the server's TimeZone.
CREATE FUNCTION adk_usage_span(p_level text) RETURNS text
    LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
    RETURN CASE p_level WHEN '1m' THEN 'day' WHEN '1h' THEN 'month' WHEN '1d' THEN 'year' END;

CREATE FUNCTION adk_usage_partition_name(p_level text, p_start timestamp) RETURNS text
    LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
    RETURN 'adk_usage_' || p_level || '_p' || to_char(p_start,
        CASE p_level WHEN '1m' THEN 'YYYYMMDD' WHEN '1h' THEN 'YYYYMM' ELSE 'YYYY' END);

-- Creates (and protects) the partition of `p_level` holding `p_bucket`
-- when missing; returns whether it did.
CREATE FUNCTION adk_ensure_usage_partition(p_level text, p_bucket timestamptz) RETURNS boolean
LANGUAGE plpgsql STRICT
SET lock_timeout = '5s'
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

-- Premakes the partitions the rollup job will write next: minutes for
-- yesterday (late events) through today + the policy's premake days, this
-- month's and next month's hours, this year's and next year's days.
-- Returns how many it created. Maintenance calls it.
CREATE FUNCTION adk_premake_usage_partitions() RETURNS integer
LANGUAGE plpgsql
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

-- Drops every rollup partition whose whole span is older than its tier's
-- retention in the policy (NULL keeps the tier forever); returns the names
-- it dropped. A partition is one table: the drop frees its disk at once and
-- writes almost no WAL, as for events.
CREATE FUNCTION adk_retire_usage_partitions() RETURNS SETOF text
LANGUAGE plpgsql
SET lock_timeout = '5s'
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

-- Usage rows carry an app, so a service role bound to apps reads only its
-- own, as for the rest of the store; the owner reads everything.
SELECT adk_protect_tenant_table('adk_usage_1m');
SELECT adk_protect_tenant_table('adk_usage_1h');
SELECT adk_protect_tenant_table('adk_usage_1d');
SELECT adk_protect_tenant_table('adk_usage_late_events');
SELECT adk_protect_tenant_table('adk_usage_invocation_tails');
SELECT adk_premake_usage_partitions();

-- As for every store function (migration 8): the PL/pgSQL ones resolve
-- names on a pinned path, the SQL-standard ones were bound at creation,
-- and none is callable by PUBLIC: only the owner rolls up and reads usage.
DO $$
DECLARE
    f      regprocedure;
    pinned boolean;
BEGIN
    FOR f, pinned IN SELECT p.oid::regprocedure, p.prosqlbody IS NULL FROM pg_proc p
                     WHERE p.pronamespace = pg_catalog.current_schema()::regnamespace
                       AND (p.proname LIKE 'adk\_usage\_%' OR p.proname IN ('adk_ensure_usage_partition',
                            'adk_premake_usage_partitions', 'adk_retire_usage_partitions')) LOOP
        IF pinned THEN
            EXECUTE pg_catalog.format('ALTER FUNCTION %s SET search_path = pg_catalog, %I, pg_temp',
                                      f, pg_catalog.current_schema());
        END IF;
        EXECUTE pg_catalog.format('REVOKE EXECUTE ON FUNCTION %s FROM PUBLIC', f);
    END LOOP;
END;
$$;
