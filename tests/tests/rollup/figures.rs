//! Usage rollups against a real PostgreSQL: every figure of every level
//! equals what the raw event log says, sketches answer within their
//! promised error, late data lands where it belongs (or is counted and
//! left out), retention of raw events never zeroes a rollup, the author cap
//! keeps totals, and a run with nothing new writes nothing.
//!
//! Events are written behind the store's back with SQL, so their own times
//! (`event_ts`) can be spread over the past days the way a busy store's log
//! looks, while their arrival times (`created_at`) are the real clock the
//! rollup job windows on.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use adk_postgres_rollup::sketch::{Distinct, Quantiles};
use adk_postgres_rollup::{
    Level, Percentiles, Resolution, RollupConfig, RollupReport, UsageFigures, UsageQuery, UsageReport, run_rollup,
    usage_at,
};
use adk_postgres_testing::test_database;
use chrono::{DateTime, Duration, NaiveDate, TimeZone, Utc};
use tokio_postgres::Client;

const NS_PER_SEC: i64 = 1_000_000_000;
const NS_PER_MIN: i64 = 60 * NS_PER_SEC;
const NS_PER_HOUR: i64 = 60 * NS_PER_MIN;
const NS_PER_DAY: i64 = 24 * NS_PER_HOUR;

/// The levels with the `date_trunc` unit of their buckets.
const LEVELS: [(Level, &str); 3] = [(Level::Minute, "minute"), (Level::Hour, "hour"), (Level::Day, "day")];

const APPS: [&str; 3] = ["app-a", "app-b", "app-c"];

async fn rollup(url: &str, config: &RollupConfig) -> RollupReport {
    let report = run_rollup(url, config).await.unwrap_or_else(|e| panic!("rollup run: {e}"));
    assert!(report.advanced(), "nothing else writes, so every run advances: {report:?}");
    report
}

async fn server_now_ns(sql: &Client) -> i64 {
    sql.query_one("SELECT (extract(epoch FROM now()) * 1000000)::bigint * 1000", &[])
        .await
        .expect("read the server clock")
        .get(0)
}

async fn today_utc(sql: &Client) -> NaiveDate {
    sql.query_one("SELECT (now() AT TIME ZONE 'UTC')::date", &[]).await.expect("read today (UTC)").get(0)
}

fn at_ns(ns: i64) -> DateTime<Utc> {
    DateTime::<Utc>::from_timestamp_nanos(ns)
}

fn midnight_ns(day: NaiveDate) -> i64 {
    Utc.from_utc_datetime(&day.and_hms_opt(0, 0, 0).expect("midnight")).timestamp_nanos_opt().expect("a day in range")
}

async fn count(sql: &Client, query: &str) -> i64 {
    sql.query_one(query, &[]).await.unwrap_or_else(|e| panic!("{query}: {e}")).get(0)
}

// ---------------------------------------------------------------------------
// Generated event logs
// ---------------------------------------------------------------------------

/// A batch of generated sessions: ids `first..first + sessions`, each with
/// 4 to 20 events in invocations of 3 to 6 events, starting at a random
/// time in `[start_from_ns, start_from_ns + start_span_ns)` and lasting at
/// most 20 minutes (gaps are at most a minute).
struct Batch {
    first: i32,
    sessions: i32,
    users: i32,
    session_day: NaiveDate,
    start_from_ns: i64,
    start_span_ns: i64,
    /// Sessions starting at or after this are written in three increments
    /// (`gen_events.phase`): the first half of their events, the next
    /// 30 %, the rest; every tenth of them only in the last increment.
    /// Earlier sessions are written whole in the first.
    split_after_ns: i64,
    seed: f64,
}

/// Generates `batch` into the connection's temporary tables `gen_sessions`
/// and `gen_events` (nothing in the store yet), so a test can write the log
/// in several increments and still know the whole of it.
///
/// The events look like what adk-rust stores: a user message opens each
/// invocation, then tool calls (`{name, args, id}` parts), tool results
/// (`functionResponse` parts), errors (a top-level `error_code`) and model
/// responses, with `usage_metadata` on most model responses and tool calls
/// (a few camelCase, as Gemini's JSON spells it) and a decimal `cost` on
/// most of those. A few events have no invocation (NULL or empty), and a
/// few go back in time (clock skew) or repeat the previous time, so
/// latencies include clamped negatives and zeros. Generation is seeded, so
/// a failure reproduces (up to where "now" puts the day boundaries).
async fn generate(sql: &Client, batch: &Batch) {
    let Batch { first, sessions, users, session_day, start_from_ns, start_span_ns, split_after_ns, seed } = batch;
    let last = first + sessions - 1;
    sql.batch_execute(&format!(
        "SELECT setseed({seed});
         CREATE TEMP TABLE IF NOT EXISTS gen_sessions (
             s int PRIMARY KEY, app_name text, user_id text, session_id text, session_day date,
             n_events int, per_invocation int, start_ns bigint);
         INSERT INTO gen_sessions
         SELECT s, 'app-' || chr(97 + s % 3), 'user-' || floor(random() * {users})::int, 'session-' || s,
                '{session_day}'::date, 4 + floor(random() * 17)::int, 3 + floor(random() * 4)::int,
                {start_from_ns}::bigint + floor(random() * {start_span_ns}::float8)::bigint
         FROM generate_series({first}, {last}) s;

         CREATE TEMP TABLE IF NOT EXISTS gen_events (
             app_name text, user_id text, session_id text, session_day date, s int, seq int, event_id text,
             invocation_id text, author text, event_ts bigint, intended text, phase int, payload jsonb);
         INSERT INTO gen_events
         WITH steps AS (
             SELECT g.*, n, (n - 1) / g.per_invocation AS inv_no, (n - 1) % g.per_invocation AS pos,
                    random() AS r_inv, random() AS r_gap, random() AS r_gap2, random() AS r_kind,
                    random() AS r_agent, random() AS r_size, random() AS r_usage, random() AS r_cost,
                    random() AS r_tok1, random() AS r_tok2
             FROM gen_sessions g CROSS JOIN LATERAL generate_series(1, g.n_events) n
             WHERE g.s BETWEEN {first} AND {last}
         ), timed AS (
             SELECT *, start_ns + sum(CASE
                     WHEN n = 1 THEN 0
                     WHEN r_gap < 0.02 THEN -floor(r_gap2 * 2e9)::bigint
                     WHEN r_gap < 0.05 THEN 0
                     ELSE floor(exp(r_gap2 * ln(60000)) * 1e6)::bigint + floor(r_gap * 1e6)::bigint
                 END) OVER (PARTITION BY s ORDER BY n) AS event_ts
             FROM steps
         ), shaped AS (
             SELECT *,
                 CASE WHEN pos = 0 THEN 'user'
                      WHEN app_name = 'app-a' THEN (ARRAY['router', 'search_agent', 'writer'])[1 + floor(r_agent * 3)::int]
                      WHEN app_name = 'app-b'
                          THEN (ARRAY['triage', 'billing_agent', 'refund_agent', 'escalation'])[1 + floor(r_agent * 4)::int]
                      ELSE (ARRAY['planner', 'coder', 'tester', 'reviewer', 'deployer'])[1 + floor(r_agent * 5)::int]
                 END AS author,
                 CASE WHEN pos = 0 THEN 'user_message' WHEN r_kind < 0.28 THEN 'tool_call'
                      WHEN r_kind < 0.53 THEN 'tool_result' WHEN r_kind < 0.60 THEN 'error'
                      ELSE 'model_response' END AS intended,
                 CASE WHEN r_inv < 0.03 THEN NULL WHEN r_inv < 0.05 THEN ''
                      ELSE 'inv-' || s || '-' || inv_no END AS invocation_id,
                 'evt-' || s || '-' || n AS event_id,
                 floor(r_tok1 * 6000)::int AS prompt, floor(r_tok2 * 900)::int AS candidates,
                 repeat(md5(s::text || ':' || n::text), 1 + floor(r_size * 40)::int) AS filler
             FROM timed
         )
         SELECT app_name, user_id, session_id, session_day, s, n, event_id, invocation_id, author, event_ts, intended,
                CASE WHEN start_ns < {split_after_ns} THEN 1 WHEN s % 10 = 0 THEN 3 WHEN n <= ceil(n_events * 0.5) THEN 1
                     WHEN n <= ceil(n_events * 0.8) THEN 2 ELSE 3 END,
                jsonb_strip_nulls(jsonb_build_object(
                    'id', event_id,
                    'invocation_id', invocation_id,
                    'author', author,
                    'timestamp', to_char(to_timestamp(event_ts / 1000000000) AT TIME ZONE 'UTC',
                                         'YYYY-MM-DD\"T\"HH24:MI:SS\"Z\"'),
                    'content', CASE intended
                        WHEN 'user_message' THEN jsonb_build_object('role', 'user',
                            'parts', jsonb_build_array(jsonb_build_object('text', filler)))
                        WHEN 'model_response' THEN jsonb_build_object('role', 'model',
                            'parts', jsonb_build_array(jsonb_build_object('text', filler)))
                        WHEN 'tool_call' THEN jsonb_build_object('role', 'model',
                            'parts', jsonb_build_array(jsonb_build_object('name', 'lookup_' || author,
                                'args', jsonb_build_object('query', left(filler, 64), 'limit', n),
                                'id', 'call-' || event_id)))
                        WHEN 'tool_result' THEN jsonb_build_object('role', 'user',
                            'parts', jsonb_build_array(jsonb_build_object('functionResponse',
                                jsonb_build_object('name', 'lookup_' || author, 'id', 'call-' || event_id,
                                                   'response', jsonb_build_object('result', filler)))))
                    END,
                    'error_code', CASE WHEN intended = 'error'
                        THEN (ARRAY['RATE_LIMITED', 'TOOL_TIMEOUT', 'MODEL_ERROR'])[1 + n % 3] END,
                    'error_message', CASE WHEN intended = 'error' THEN left(filler, 80) END,
                    'usage_metadata', CASE
                        WHEN intended NOT IN ('model_response', 'tool_call') OR r_usage >= 0.9 THEN NULL
                        WHEN r_usage < 0.05 THEN jsonb_build_object('promptTokenCount', prompt,
                            'candidatesTokenCount', candidates, 'totalTokenCount', prompt + candidates)
                        ELSE jsonb_build_object('prompt_token_count', prompt, 'candidates_token_count', candidates,
                            'total_token_count', prompt + candidates,
                            'cost', CASE WHEN r_cost < 0.7 THEN prompt * 0.000025 + candidates * 0.000125 END)
                    END))
         FROM shaped;"
    ))
    .await
    .expect("generate sessions and events");
}

async fn insert_sessions(sql: &Client, first: i32, last: i32) {
    sql.execute(
        "INSERT INTO adk_sessions (app_name, user_id, session_id, session_day, last_seq)
         SELECT app_name, user_id, session_id, session_day, n_events FROM gen_sessions WHERE s BETWEEN $1 AND $2",
        &[&first, &last],
    )
    .await
    .expect("insert generated sessions");
}

/// Appends the generated events matching `filter` (SQL on `gen_events`) in
/// log order; returns how many.
async fn insert_events(sql: &Client, filter: &str) -> u64 {
    sql.execute(
        &format!(
            "INSERT INTO adk_events (app_name, user_id, session_id, session_day, seq, event_id, invocation_id,
                                     author, event_ts, payload)
             SELECT app_name, user_id, session_id, session_day, seq, event_id, invocation_id, author, event_ts, payload
             FROM gen_events WHERE {filter} ORDER BY s, seq"
        ),
        &[],
    )
    .await
    .unwrap_or_else(|e| panic!("insert generated events ({filter}): {e}"))
}

// ---------------------------------------------------------------------------
// The reference: figures straight from the raw log
// ---------------------------------------------------------------------------

/// Rebuilds the temporary table `ref_events`: every stored event with what
/// it should contribute, computed from the raw log alone. Bucketing uses
/// whole seconds (integer division of `event_ts`) rather than a float
/// division, so an event a nanosecond before a minute boundary cannot be
/// rounded into the next minute by the reference itself. Latency is the
/// time since the previous event of the same invocation in the session's
/// seq order, clamped at 0; events without an invocation have none.
async fn build_reference(sql: &Client) {
    sql.batch_execute(
        "DROP TABLE IF EXISTS ref_events;
         CREATE TEMP TABLE ref_events AS
         SELECT app_name, user_id, session_id, author, adk_usage_kind(payload, author) AS kind,
                event_ts, event_ts / 1000000000 AS second,
                adk_usage_bytes(payload) AS bytes,
                coalesce((payload->'usage_metadata'->>'prompt_token_count')::bigint,
                         (payload->'usage_metadata'->>'promptTokenCount')::bigint, 0) AS prompt,
                coalesce((payload->'usage_metadata'->>'candidates_token_count')::bigint,
                         (payload->'usage_metadata'->>'candidatesTokenCount')::bigint, 0) AS candidates,
                coalesce((payload->'usage_metadata'->>'total_token_count')::bigint,
                         (payload->'usage_metadata'->>'totalTokenCount')::bigint, 0) AS total,
                (payload->'usage_metadata'->>'cost')::numeric AS cost,
                -- greatest() skips NULLs: the first event of an invocation
                -- must be tested for having no previous one first.
                CASE WHEN NULLIF(invocation_id, '') IS NULL OR lag(event_ts) OVER w IS NULL THEN NULL
                     ELSE greatest(event_ts - lag(event_ts) OVER w, 0)::float8 / 1e6 END AS latency_ms
         FROM adk_events
         WINDOW w AS (PARTITION BY app_name, user_id, session_id, session_day, NULLIF(invocation_id, '')
                      ORDER BY seq);",
    )
    .await
    .expect("build the reference from the raw log");
}

/// Every difference between a level's rows and the same figures computed
/// from `ref_events`, as JSON lines (empty: equal). With `by_author`, rows
/// are compared one for one (named authors only, so it expects no folded
/// row); without, the level's rows are summed per (app, kind, bucket), so
/// folding authors must not change any total.
async fn level_differences(sql: &Client, level: Level, unit: &str, by_author: bool) -> (Vec<String>, i64) {
    let table = level.table();
    let (ref_author, actual) = if by_author {
        (
            "author, false AS folded,",
            format!(
                "SELECT app_name, author, folded, kind, bucket_start, events, payload_bytes, payload_bytes_min,
                        payload_bytes_max, prompt_tokens, candidates_tokens, total_tokens, cost, cost_events, errors,
                        latency_count
                 FROM {table}"
            ),
        )
    } else {
        (
            "",
            format!(
                "SELECT app_name, kind, bucket_start, sum(events)::bigint, sum(payload_bytes)::bigint,
                        min(payload_bytes_min), max(payload_bytes_max), sum(prompt_tokens)::bigint,
                        sum(candidates_tokens)::bigint, sum(total_tokens)::bigint, sum(cost),
                        sum(cost_events)::bigint, sum(errors)::bigint, sum(latency_count)::bigint
                 FROM {table} GROUP BY app_name, kind, bucket_start"
            ),
        )
    };
    let group = if by_author { "app_name, author, kind, bucket_start" } else { "app_name, kind, bucket_start" };
    let query = format!(
        "WITH expected AS (
             SELECT app_name, {ref_author} kind, bucket_start,
                    count(*) AS events, sum(bytes)::bigint AS payload_bytes, min(bytes), max(bytes),
                    sum(prompt)::bigint, sum(candidates)::bigint, sum(total)::bigint, sum(cost), count(cost),
                    count(*) FILTER (WHERE kind = 'error'), count(latency_ms)
             FROM (SELECT *, date_trunc('{unit}', to_timestamp(second) AT TIME ZONE 'UTC') AT TIME ZONE 'UTC'
                               AS bucket_start
                   FROM ref_events) r
             GROUP BY {group}
         ), actual AS ({actual}),
         missing AS (SELECT * FROM expected EXCEPT ALL SELECT * FROM actual),
         unexpected AS (SELECT * FROM actual EXCEPT ALL SELECT * FROM expected)
         SELECT (SELECT count(*) FROM expected),
                coalesce((SELECT array_agg('expected, not in the rollup: ' || row_to_json(m)::text) FROM
                              (SELECT * FROM missing LIMIT 10) m), '{{}}')
                || coalesce((SELECT array_agg('in the rollup, not expected: ' || row_to_json(u)::text) FROM
                              (SELECT * FROM unexpected LIMIT 10) u), '{{}}')"
    );
    let row = sql.query_one(&query, &[]).await.unwrap_or_else(|e| panic!("compare {table} with the raw log: {e}"));
    (row.get(1), row.get(0))
}

/// Asserts every level equals the raw log, row for row, and counts every
/// event exactly once.
async fn assert_levels_exact(sql: &Client, when: &str) {
    build_reference(sql).await;
    let total = count(sql, "SELECT count(*) FROM ref_events").await;
    for (level, unit) in LEVELS {
        let (differences, rows) = level_differences(sql, level, unit, true).await;
        assert!(differences.is_empty(), "{when}: {level} rows differ from the raw log:\n{}", differences.join("\n"));
        assert!(rows > 0, "{when}: the raw log has {level} buckets");
        let folded = count(sql, &format!("SELECT count(*) FROM {} WHERE folded", level.table())).await;
        assert_eq!(folded, 0, "{when}: no author was above the default cap");
        let rolled = count(sql, &format!("SELECT coalesce(sum(events), 0)::bigint FROM {}", level.table())).await;
        assert_eq!(rolled, total, "{when}: {level} counts every event once");
    }
}

// ---------------------------------------------------------------------------
// Snapshots and deltas
// ---------------------------------------------------------------------------

/// Copies every level into temporary `snap_1m`, `snap_1h`, `snap_1d`.
async fn snapshot(sql: &Client) {
    for (level, _) in LEVELS {
        sql.batch_execute(&format!(
            "DROP TABLE IF EXISTS snap_{l}; CREATE TEMP TABLE snap_{l} AS SELECT * FROM {t};",
            l = level.as_str(),
            t = level.table()
        ))
        .await
        .expect("snapshot a level");
    }
}

/// A row that differs from its snapshot (whole-row text, sketches
/// included): its key and how its figures moved.
#[derive(Debug, Clone, PartialEq)]
struct Delta {
    app: String,
    author: String,
    folded: bool,
    kind: String,
    bucket_start: DateTime<Utc>,
    existed: bool,
    events: i64,
    payload_bytes: i64,
    min_after: Option<i32>,
    max_after: Option<i32>,
    min_before: Option<i32>,
    max_before: Option<i32>,
    prompt_tokens: i64,
    candidates_tokens: i64,
    total_tokens: i64,
    cost: String,
    cost_events: i64,
    errors: i64,
    latency_count: i64,
    /// The columns whose values differ (all of them for a new row).
    columns: Vec<String>,
    /// Whether the row's sketches, before and after, give the same
    /// answers (counts, quantiles, distinct estimates).
    same_answers: bool,
}

/// The sketch columns of a level's row, as [`deltas`] selects them.
const SKETCH_COLUMNS: [&str; 4] = ["latency_sketch", "size_sketch", "sessions_sketch", "users_sketch"];

fn quantile_answers(column: &'static str, bytes: &[u8]) -> Vec<Option<f64>> {
    let sketch = Quantiles::decode(column, bytes).unwrap_or_else(|e| panic!("{e}"));
    let mut answers = vec![Some(sketch.count() as f64)];
    answers.extend([0.0, 0.5, 0.95, 0.99, 1.0].map(|q| sketch.quantile(q)));
    answers
}

fn distinct_answer(column: &'static str, bytes: &[u8]) -> Vec<Option<f64>> {
    vec![Some(Distinct::decode(column, bytes).unwrap_or_else(|e| panic!("{e}")).estimate())]
}

/// Whether two versions of a row's sketches answer alike.
fn same_answers(after: &[Option<Vec<u8>>], before: &[Option<Vec<u8>>]) -> bool {
    let answers = |sketches: &[Option<Vec<u8>>]| -> Option<Vec<Vec<Option<f64>>>> {
        let [latency, size, sessions, users] = sketches else { return None };
        Some(vec![
            quantile_answers("latency_sketch", latency.as_deref()?),
            quantile_answers("size_sketch", size.as_deref()?),
            distinct_answer("sessions_sketch", sessions.as_deref()?),
            distinct_answer("users_sketch", users.as_deref()?),
        ])
    };
    answers(after).is_some() && answers(after) == answers(before)
}

/// The rows of `level` that differ from the snapshot, in
/// `[from, to)` when given.
async fn deltas(sql: &Client, level: Level, range: Option<(DateTime<Utc>, DateTime<Utc>)>) -> Vec<Delta> {
    let (from, to) = range.unwrap_or((at_ns(0), at_ns(i64::MAX)));
    let query = format!(
        "SELECT coalesce(a.app_name, b.app_name), coalesce(a.author, b.author), coalesce(a.folded, b.folded),
                coalesce(a.kind, b.kind), coalesce(a.bucket_start, b.bucket_start), b.app_name IS NOT NULL,
                coalesce(a.events, 0) - coalesce(b.events, 0),
                coalesce(a.payload_bytes, 0) - coalesce(b.payload_bytes, 0),
                a.payload_bytes_min, a.payload_bytes_max, b.payload_bytes_min, b.payload_bytes_max,
                coalesce(a.prompt_tokens, 0) - coalesce(b.prompt_tokens, 0),
                coalesce(a.candidates_tokens, 0) - coalesce(b.candidates_tokens, 0),
                coalesce(a.total_tokens, 0) - coalesce(b.total_tokens, 0),
                trim_scale(coalesce(a.cost, 0) - coalesce(b.cost, 0))::text,
                coalesce(a.cost_events, 0) - coalesce(b.cost_events, 0),
                coalesce(a.errors, 0) - coalesce(b.errors, 0),
                coalesce(a.latency_count, 0) - coalesce(b.latency_count, 0),
                ARRAY(SELECT ja.key FROM jsonb_each(to_jsonb(a)) ja
                      LEFT JOIN jsonb_each(to_jsonb(b)) jb ON jb.key = ja.key
                      WHERE jb.value IS DISTINCT FROM ja.value ORDER BY 1),
                a.latency_sketch, a.size_sketch, a.sessions_sketch, a.users_sketch,
                b.latency_sketch, b.size_sketch, b.sessions_sketch, b.users_sketch
         FROM {table} a
         FULL JOIN snap_{l} b ON (a.app_name, a.author, a.folded, a.kind, a.bucket_start)
                               = (b.app_name, b.author, b.folded, b.kind, b.bucket_start)
         WHERE (a.app_name IS NULL OR b.app_name IS NULL OR a::text <> b::text)
           AND coalesce(a.bucket_start, b.bucket_start) >= $1 AND coalesce(a.bucket_start, b.bucket_start) < $2
         ORDER BY 1, 5, 2, 4, 3",
        table = level.table(),
        l = level.as_str()
    );
    sql.query(&query, &[&from, &to])
        .await
        .unwrap_or_else(|e| panic!("compare {level} with its snapshot: {e}"))
        .iter()
        .map(|r| Delta {
            app: r.get(0),
            author: r.get(1),
            folded: r.get(2),
            kind: r.get(3),
            bucket_start: r.get(4),
            existed: r.get(5),
            events: r.get(6),
            payload_bytes: r.get(7),
            min_after: r.get(8),
            max_after: r.get(9),
            min_before: r.get(10),
            max_before: r.get(11),
            prompt_tokens: r.get(12),
            candidates_tokens: r.get(13),
            total_tokens: r.get(14),
            cost: r.get(15),
            cost_events: r.get(16),
            errors: r.get(17),
            latency_count: r.get(18),
            columns: r.get(19),
            same_answers: same_answers(
                &(20..24).map(|i| r.get::<_, Option<Vec<u8>>>(i)).collect::<Vec<_>>(),
                &(24..28).map(|i| r.get::<_, Option<Vec<u8>>>(i)).collect::<Vec<_>>(),
            ),
        })
        .collect()
}

/// What one event should add to the row of its bucket.
struct OneEvent<'a> {
    app: &'a str,
    author: &'a str,
    kind: &'a str,
    event_ts: i64,
    bytes: i32,
    prompt: i64,
    candidates: i64,
    total: i64,
    cost: &'a str,
    with_latency: bool,
}

/// Asserts that, at every level, the row in `range` of `event`'s bucket
/// (and author and kind) changed by exactly that event, and no other row
/// changed what it says. The other rows of a recomputed hour or day are
/// allowed new bytes for equal sketches: merging the same rows in another
/// order can lay out an equal HyperLogLog differently.
async fn assert_changed_by_exactly(
    sql: &Client,
    event: &OneEvent<'_>,
    range: Option<(DateTime<Utc>, DateTime<Utc>)>,
    must_have_existed: bool,
) {
    for (level, _) in LEVELS {
        let bucket = Level::bucket_of(level, at_ns(event.event_ts));
        let (mine, others): (Vec<Delta>, Vec<Delta>) = deltas(sql, level, range).await.into_iter().partition(|d| {
            (d.app.as_str(), d.author.as_str(), d.folded, d.kind.as_str(), d.bucket_start)
                == (event.app, event.author, false, event.kind, bucket)
        });
        for other in &others {
            assert!(
                other.existed
                    && other.columns.iter().all(|c| SKETCH_COLUMNS.contains(&c.as_str()))
                    && other.same_answers,
                "{level}: a row other than the event's changed what it says: {other:#?}"
            );
        }
        assert_eq!(mine.len(), 1, "{level}: the event's bucket changed");
        let d = &mine[0];
        if must_have_existed {
            assert!(d.existed, "{level}: the bucket had rows before, so it was merged into, not created");
        }
        assert_eq!(
            (d.events, d.payload_bytes, d.prompt_tokens, d.candidates_tokens, d.total_tokens),
            (1, i64::from(event.bytes), event.prompt, event.candidates, event.total),
            "{level}: counts and sums move by exactly the event"
        );
        assert_eq!(
            (d.cost.as_str(), d.cost_events, d.errors, d.latency_count),
            (event.cost, 1, 0, i64::from(event.with_latency)),
            "{level}: cost, errors and latency move by exactly the event"
        );
        let (min, max) = match (d.min_before, d.max_before) {
            (Some(min), Some(max)) => (min.min(event.bytes), max.max(event.bytes)),
            _ => (event.bytes, event.bytes),
        };
        assert_eq!((d.min_after, d.max_after), (Some(min), Some(max)), "{level}: extremes");
    }
}

// ---------------------------------------------------------------------------
// Sketch checks
// ---------------------------------------------------------------------------

/// The value at rank `⌊q·(n−1)⌋` of `sorted`: the sketches' definition.
fn exact_quantile(sorted: &[f64], q: f64) -> f64 {
    let rank = (q * (sorted.len() as f64 - 1.0)).floor() as usize;
    sorted[rank]
}

fn assert_quantiles(what: &str, got: &Percentiles, values: &mut [f64]) {
    assert!(!values.is_empty(), "{what}: the raw log has values");
    values.sort_by(f64::total_cmp);
    for (q, got) in [(0.50, got.p50), (0.95, got.p95), (0.99, got.p99)] {
        let want = exact_quantile(values, q);
        let got = got.unwrap_or_else(|| panic!("{what}: p{} missing, exact {want}", q * 100.0));
        assert!(
            (got - want).abs() <= 0.01 * want.abs(),
            "{what}: p{} is {got}, exact {want} (n = {}): more than 1 % off",
            q * 100.0,
            values.len()
        );
    }
}

fn assert_distinct(what: &str, got: u64, want: i64) {
    let (got, want) = (got as f64, want as f64);
    assert!(want > 0.0, "{what}: the raw log has some");
    assert!((got - want).abs() <= 0.02 * want, "{what}: estimated {got}, exactly {want}: more than 2 % off");
}

async fn usage_report(url: &str, app: &str, since: DateTime<Utc>, until: DateTime<Utc>, step: Duration) -> UsageReport {
    let query =
        UsageQuery { app: app.to_owned(), window: Some((since, until)), by: None, resolution: Resolution::Every(step) };
    usage_at(url, &query).await.unwrap_or_else(|e| panic!("usage of {app} from {since} to {until}: {e}"))
}

/// The one series of a report without grouping.
fn all(report: &UsageReport) -> &UsageFigures {
    assert_eq!(report.series.len(), 1, "no grouping: one series");
    assert_eq!(report.series[0].group, "all");
    &report.series[0].total
}

/// What a distinct count covers: the whole window, or the UTC day or hour
/// with this many days or hours since the epoch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Scope {
    Window,
    Day(i64),
    Hour(i64),
}

/// Raw latencies and sizes of one app, for exact quantiles.
#[derive(Default)]
struct RawValues {
    latency: Vec<f64>,
    size: Vec<f64>,
    events: i64,
}

/// Percentiles of latency and payload size, and distinct sessions and
/// users, from the usage query (reading the day rows for the whole window
/// and per day, the hour rows for single hours) against the raw log.
async fn assert_sketches_match_the_log(sql: &Client, url: &str) {
    build_reference(sql).await;
    let rows = sql
        .query("SELECT app_name, second / 3600, latency_ms, bytes FROM ref_events", &[])
        .await
        .expect("read raw latencies and sizes");
    let mut whole: HashMap<String, RawValues> = HashMap::new();
    let mut hourly: BTreeMap<(String, i64), RawValues> = BTreeMap::new();
    for row in &rows {
        let app: String = row.get(0);
        let hour: i64 = row.get(1);
        let latency: Option<f64> = row.get(2);
        let bytes: i32 = row.get(3);
        for values in [whole.entry(app.clone()).or_default(), hourly.entry((app.clone(), hour)).or_default()] {
            values.events += 1;
            values.size.push(f64::from(bytes));
            values.latency.extend(latency);
        }
    }
    let distinct = |group: &str| {
        format!(
            "SELECT app_name, {group}, count(DISTINCT (user_id, session_id)), count(DISTINCT user_id)
             FROM ref_events GROUP BY 1, 2"
        )
    };
    let mut sessions_users: HashMap<(String, Scope), (i64, i64)> = HashMap::new();
    for (scope, group) in
        [(Scope::Window, "0::bigint"), (Scope::Day(0), "second / 86400"), (Scope::Hour(0), "second / 3600")]
    {
        for row in sql.query(&distinct(group), &[]).await.expect("distinct sessions and users") {
            let at: i64 = row.get(1);
            let scope = match scope {
                Scope::Window => Scope::Window,
                Scope::Day(_) => Scope::Day(at),
                Scope::Hour(_) => Scope::Hour(at),
            };
            sessions_users.insert((row.get(0), scope), (row.get(2), row.get(3)));
        }
    }

    let now = server_now_ns(sql).await;
    let (since, until) = (at_ns(now - 4 * NS_PER_DAY), at_ns(now + NS_PER_HOUR));
    for app in APPS {
        let report = usage_report(url, app, since, until, Duration::days(1)).await;
        assert_eq!(report.plan.level, Level::Day, "a day resolution reads the day rows");
        let total = all(&report);
        let raw = whole.get_mut(app).expect("the app has events");
        assert_eq!(total.events, raw.events, "{app}: events over the window");
        assert_quantiles(&format!("{app} latency over the window"), &total.latency_ms, &mut raw.latency);
        assert_quantiles(&format!("{app} payload size over the window"), &total.payload_size, &mut raw.size);
        let (sessions, users) = sessions_users[&(app.to_owned(), Scope::Window)];
        // A DataSketches HLL of lg_k 14 leaves its exact coupon modes above
        // about 1,500 distinct values.
        assert!(sessions > 2_000 && users > 2_000, "{app}: enough to put the HyperLogLogs in estimation mode");
        assert_distinct(&format!("{app} sessions over the window"), total.sessions, sessions);
        assert_distinct(&format!("{app} users over the window"), total.users, users);
        let points = &report.series[0].points;
        assert!(points.len() >= 3, "{app}: three days of events span at least three UTC days");
        for point in points {
            let day = point.start.timestamp() / 86_400;
            let (sessions, users) = sessions_users[&(app.to_owned(), Scope::Day(day))];
            assert_distinct(&format!("{app} sessions on {}", point.start), point.figures.sessions, sessions);
            assert_distinct(&format!("{app} users on {}", point.start), point.figures.users, users);
        }

        // A few single hours, read from the hour rows: early, middle, late.
        let hours: Vec<i64> = hourly.keys().filter(|(a, _)| a == app).map(|(_, h)| *h).collect();
        for hour in [hours[hours.len() / 4], hours[hours.len() / 2], hours[3 * hours.len() / 4]] {
            let start = at_ns(hour * NS_PER_HOUR);
            let report = usage_report(url, app, start, start + Duration::hours(1), Duration::hours(1)).await;
            assert_eq!(report.plan.level, Level::Hour, "an hour resolution reads the hour rows");
            let figures = all(&report);
            let raw = hourly.get_mut(&(app.to_owned(), hour)).expect("the hour has events");
            assert_eq!(figures.events, raw.events, "{app} events in the hour from {start}");
            assert_quantiles(&format!("{app} latency in the hour from {start}"), &figures.latency_ms, &mut raw.latency);
            assert_quantiles(&format!("{app} size in the hour from {start}"), &figures.payload_size, &mut raw.size);
            let (sessions, users) = sessions_users[&(app.to_owned(), Scope::Hour(hour))];
            assert_distinct(&format!("{app} sessions in the hour from {start}"), figures.sessions, sessions);
            assert_distinct(&format!("{app} users in the hour from {start}"), figures.users, users);
        }
    }
}

// ---------------------------------------------------------------------------
// Tests
// ---------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread")]
async fn three_days_of_events_roll_up_exactly_and_sketches_stay_within_their_error() {
    let db = test_database().await;
    let sql = db.connect().await;
    // The log's own times go back three days; the default 24 h lateness
    // would reject most of it as late.
    sql.batch_execute("UPDATE adk_store_policy SET usage_lateness = '4 days'").await.expect("widen lateness");
    let now = server_now_ns(&sql).await;
    let today = today_utc(&sql).await;
    let batch = Batch {
        first: 1,
        sessions: 9_000,
        users: 5_000,
        session_day: today,
        start_from_ns: now - 3 * NS_PER_DAY,
        start_span_ns: 3 * NS_PER_DAY - NS_PER_HOUR,
        // Later increments continue the sessions of the last 60 hours, so
        // each later run lands in thousands of minutes already rolled up.
        split_after_ns: now - 60 * NS_PER_HOUR,
        seed: 0.2026,
    };
    generate(&sql, &batch).await;
    insert_sessions(&sql, 1, 9_000).await;
    let generated = count(&sql, "SELECT count(*) FROM gen_events").await;
    assert!(generated >= 100_000, "{generated} events");
    // The generated shapes are the ones the classification is written
    // for: each is recognised as what it was generated as.
    let misread =
        count(&sql, "SELECT count(*) FROM gen_events WHERE adk_usage_kind(payload, author) <> intended").await;
    assert_eq!(misread, 0, "adk_usage_kind reads every generated shape as intended");
    let kinds = sql
        .query("SELECT intended, count(*) FROM gen_events GROUP BY 1", &[])
        .await
        .expect("kinds")
        .iter()
        .map(|r| (r.get::<_, String>(0), r.get::<_, i64>(1)))
        .collect::<BTreeMap<_, _>>();
    assert!(kinds.len() == 5 && kinds.values().all(|n| *n > 2_000), "every kind well represented: {kinds:?}");

    // Three increments: the later ones continue sessions and invocations
    // of the first (their latency needs the invocation tails of earlier
    // runs), start new sessions, and land in minutes earlier runs already
    // wrote, so minute rows are merged and hours and days recomputed.
    let mut previous_to = None;
    for phase in 1..=3 {
        let inserted = insert_events(&sql, &format!("phase = {phase}")).await;
        if phase > 1 {
            let merged = count(
                &sql,
                &format!(
                    "SELECT count(*) FROM gen_events e WHERE e.phase = {phase} AND EXISTS (
                         SELECT 1 FROM adk_usage_1m u WHERE u.app_name = e.app_name
                           AND u.bucket_start = to_timestamp(e.event_ts / 60000000000 * 60))"
                ),
            )
            .await;
            assert!(merged > 1_000, "phase {phase}: {merged} events land in minutes already rolled up");
        }
        let report = rollup(db.url(), &RollupConfig::default()).await;
        assert_eq!(report.window_from, previous_to, "each run starts where the last one stopped");
        assert_eq!(
            (report.events_read, report.events_rolled_up, report.late_rejected),
            (inserted, inserted, 0),
            "phase {phase}: {report}"
        );
        previous_to = report.window_to;
        // After the second increment, the third one's check covers it: a
        // wrong merge cannot be undone by a later one.
        if phase != 2 {
            assert_levels_exact(&sql, &format!("after phase {phase}")).await;
        }
    }
    assert_eq!(count(&sql, "SELECT count(*) FROM adk_events").await, generated);
    assert_sketches_match_the_log(&sql, db.url()).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn late_events_update_their_buckets_within_the_window_and_are_counted_beyond_it() {
    let db = test_database().await;
    let sql = db.connect().await;
    let lateness: String =
        sql.query_one("SELECT usage_lateness::text FROM adk_store_policy", &[]).await.expect("policy").get(0);
    assert_eq!(lateness, "24:00:00", "the default lateness window");
    let session_day: NaiveDate = sql
        .query_one(
            "INSERT INTO adk_sessions (app_name, user_id, session_id) VALUES ('app-a', 'u1', 's1')
             RETURNING session_day",
            &[],
        )
        .await
        .expect("session")
        .get(0);
    let insert = |seq: i64, invocation: &'static str, author: &'static str, event_ts: i64, payload: String| {
        let sql = &sql;
        async move {
            sql.execute(
                "INSERT INTO adk_events (app_name, user_id, session_id, session_day, seq, event_id, invocation_id,
                                         author, event_ts, payload)
                 VALUES ('app-a', 'u1', 's1', $1, $2, 'e' || $2::bigint::text, $3, $4, $5, $6::text::jsonb)",
                &[&session_day, &seq, &invocation, &author, &event_ts, &payload],
            )
            .await
            .expect("insert an event");
        }
    };
    let model = |text: &str, prompt: i64, candidates: i64, cost: &str| {
        format!(
            r#"{{"author": "assistant", "content": {{"role": "model", "parts": [{{"text": "{text}"}}]}},
                "usage_metadata": {{"prompt_token_count": {prompt}, "candidates_token_count": {candidates},
                                    "total_token_count": {}, "cost": {cost}}}}}"#,
            prompt + candidates
        )
    };

    // The bucket the late event will land in already has a row (from the
    // previous event of its invocation), its hour another minute, and the
    // recent past some more.
    let now = server_now_ns(&sql).await;
    let late_ok = now - 23 * NS_PER_HOUR;
    let minute = late_ok.div_euclid(NS_PER_MIN) * NS_PER_MIN;
    let hour = late_ok.div_euclid(NS_PER_HOUR) * NS_PER_HOUR;
    insert(1, "inv-1", "user", minute - 90 * NS_PER_SEC, r#"{"content": {"parts": [{"text": "hi"}]}}"#.into()).await;
    insert(2, "inv-1", "assistant", minute, model("a long answer with more bytes", 10, 20, "0.5")).await;
    insert(3, "inv-0", "assistant", hour + 5 * NS_PER_SEC, model("x", 1, 2, "0.25")).await;
    insert(4, "inv-9", "assistant", now - 5 * NS_PER_MIN, model("recent", 7, 8, "0.001")).await;
    let first = rollup(db.url(), &RollupConfig::default()).await;
    assert_eq!((first.events_rolled_up, first.late_rejected), (4, 0), "{first}");

    // 23 hours old: within the window, merged into its minute, and its hour
    // and day recomputed.
    snapshot(&sql).await;
    let payload = model("late", 120, 30, "0.000125");
    insert(5, "inv-1", "assistant", late_ok, payload.clone()).await;
    let bytes: i32 = sql
        .query_one("SELECT octet_length(payload::text) FROM adk_events WHERE event_id = 'e5'", &[])
        .await
        .expect("stored size")
        .get(0);
    let second = rollup(db.url(), &RollupConfig::default()).await;
    assert_eq!((second.events_read, second.events_rolled_up, second.late_rejected), (1, 1, 0), "{second}");
    let event = OneEvent {
        app: "app-a",
        author: "assistant",
        kind: "model_response",
        event_ts: late_ok,
        bytes,
        prompt: 120,
        candidates: 30,
        total: 150,
        cost: "0.000125",
        // Its previous event (seq 2) came in the first run: the latency is
        // taken from the invocation's tail.
        with_latency: true,
    };
    assert_changed_by_exactly(&sql, &event, None, true).await;
    assert_eq!(
        (second.minute_buckets, second.hour_buckets, second.day_buckets),
        (1, 1, 1),
        "one bucket per level recomputed"
    );

    // 25 hours old: outside the window, rolled up nowhere, counted.
    snapshot(&sql).await;
    let too_late = now - 25 * NS_PER_HOUR;
    insert(6, "inv-2", "assistant", too_late, model("too late", 5, 5, "1")).await;
    let third = rollup(db.url(), &RollupConfig::default()).await;
    assert_eq!((third.events_read, third.events_rolled_up, third.late_rejected), (1, 0, 1), "{third}");
    for (level, _) in LEVELS {
        let changed = deltas(&sql, level, None).await;
        assert!(changed.is_empty(), "{level}: a rejected event changes no row: {changed:#?}");
    }
    let too_late_minute = at_ns(too_late.div_euclid(NS_PER_MIN) * NS_PER_MIN);
    let rows_there: i64 = sql
        .query_one("SELECT count(*) FROM adk_usage_1m WHERE bucket_start = $1", &[&too_late_minute])
        .await
        .expect("count")
        .get(0);
    assert_eq!(rows_there, 0, "no minute row for the rejected event");
    let late = sql
        .query(
            "SELECT l.app_name, l.arrival_day, l.rejected, l.last_event_ts,
                    (e.created_at AT TIME ZONE 'UTC')::date, (now() AT TIME ZONE 'UTC')::date
             FROM adk_usage_late_events l, adk_events e WHERE e.event_id = 'e6'",
            &[],
        )
        .await
        .expect("late counters");
    assert_eq!(late.len(), 1, "one late counter");
    let (app, arrival_day, rejected, last_ts): (String, NaiveDate, i64, i64) =
        (late[0].get(0), late[0].get(1), late[0].get(2), late[0].get(3));
    let (arrived, today): (NaiveDate, NaiveDate) = (late[0].get(4), late[0].get(5));
    assert_eq!((app.as_str(), rejected, last_ts), ("app-a", 1, too_late));
    assert_eq!(arrival_day, arrived, "counted on its UTC day of arrival");
    assert!(arrival_day == today || arrival_day.succ_opt() == Some(today), "today, unless midnight just passed");
    let recorded: i64 = sql
        .query_one("SELECT late_rejected FROM adk_usage_runs WHERE outcome = 'ok' ORDER BY run_id DESC LIMIT 1", &[])
        .await
        .expect("last run")
        .get(0);
    assert_eq!(recorded, 1, "the run's record counts it too");
}

#[tokio::test(flavor = "multi_thread")]
async fn dropping_a_day_of_raw_events_never_changes_its_rollups() {
    let db = test_database().await;
    let sql = db.connect().await;
    sql.batch_execute("UPDATE adk_store_policy SET usage_lateness = '4 days'").await.expect("widen lateness");
    let today = today_utc(&sql).await;
    let day = today.pred_opt().and_then(|d| d.pred_opt()).expect("two days ago");
    sql.execute("SELECT adk_ensure_event_partition($1)", &[&day]).await.expect("partition of the past day");
    let now = server_now_ns(&sql).await;
    // Sessions of the past day with events in it, and sessions of today.
    let past = Batch {
        first: 1,
        sessions: 600,
        users: 200,
        session_day: day,
        start_from_ns: midnight_ns(day),
        start_span_ns: 23 * NS_PER_HOUR,
        split_after_ns: i64::MAX,
        seed: 0.31,
    };
    let recent = Batch {
        first: 601,
        sessions: 300,
        users: 200,
        session_day: today,
        start_from_ns: now - 2 * NS_PER_HOUR,
        start_span_ns: NS_PER_HOUR,
        split_after_ns: i64::MAX,
        seed: 0.32,
    };
    for batch in [&past, &recent] {
        generate(&sql, batch).await;
    }
    insert_sessions(&sql, 1, 900).await;
    insert_events(&sql, "s <= 900").await;
    rollup(db.url(), &RollupConfig::default()).await;
    assert_levels_exact(&sql, "before the drop").await;

    let range = Some((at_ns(midnight_ns(day)), at_ns(midnight_ns(day) + NS_PER_DAY)));
    let before: i64 =
        count(&sql, &format!("SELECT sum(events)::bigint FROM adk_usage_1d WHERE bucket_start = '{day} 00:00:00+00'"))
            .await;
    assert!(before > 5_000, "the past day has a real volume: {before}");
    snapshot(&sql).await;

    // As maintenance retires a day: detach and drop its partition, then
    // its sessions.
    let partition = format!("adk_events_p{}", day.format("%Y%m%d"));
    sql.batch_execute(&format!("ALTER TABLE adk_events DETACH PARTITION {partition} CONCURRENTLY"))
        .await
        .expect("detach the day");
    sql.batch_execute(&format!("DROP TABLE {partition}")).await.expect("drop the day");
    sql.execute("DELETE FROM adk_sessions WHERE session_day = $1", &[&day]).await.expect("its sessions");
    let left = count(
        &sql,
        &format!(
            "SELECT count(*) FROM adk_events WHERE event_ts >= {} AND event_ts < {}",
            midnight_ns(day),
            midnight_ns(day) + NS_PER_DAY
        ),
    )
    .await;
    assert_eq!(left, 0, "no raw event of the day is left");

    // More appends (today) and a run: the day's rows stay byte for byte.
    let more = Batch {
        first: 901,
        sessions: 300,
        users: 200,
        session_day: today,
        start_from_ns: now - 50 * NS_PER_MIN,
        start_span_ns: 20 * NS_PER_MIN,
        split_after_ns: i64::MAX,
        seed: 0.33,
    };
    generate(&sql, &more).await;
    insert_sessions(&sql, 901, 1_200).await;
    let appended = insert_events(&sql, "s > 900").await;
    let report = rollup(db.url(), &RollupConfig::default()).await;
    assert_eq!(report.events_rolled_up, appended, "{report}");
    for (level, _) in LEVELS {
        let changed = deltas(&sql, level, range).await;
        assert!(changed.is_empty(), "{level}: rows of the dropped day changed: {changed:#?}");
    }

    // A late event into one of the day's minutes: its minute, hour and day
    // move by exactly that event, so none of them was recomputed from the
    // (now missing) raw events.
    snapshot(&sql).await;
    let target = sql
        .query_one(
            "SELECT bucket_start FROM adk_usage_1m
             WHERE app_name = 'app-a' AND author = 'writer' AND kind = 'model_response'
               AND bucket_start >= $1 AND bucket_start < $2
             ORDER BY events DESC, bucket_start LIMIT 1",
            &[&range.map(|r| r.0), &range.map(|r| r.1)],
        )
        .await
        .expect("a minute of the dropped day");
    let minute: DateTime<Utc> = target.get(0);
    let event_ts = minute.timestamp_nanos_opt().expect("in range") + 30 * NS_PER_SEC;
    sql.batch_execute(
        "INSERT INTO adk_sessions (app_name, user_id, session_id) VALUES ('app-a', 'late-user', 'late-session')",
    )
    .await
    .expect("a session for the late event");
    sql.execute(
        "INSERT INTO adk_events (app_name, user_id, session_id, session_day, seq, event_id, invocation_id, author,
                                 event_ts, payload)
         SELECT 'app-a', 'late-user', 'late-session', session_day, 1, 'late-1', 'inv-late', 'writer', $1,
                '{\"content\": {\"role\": \"model\", \"parts\": [{\"text\": \"late\"}]},
                  \"usage_metadata\": {\"prompt_token_count\": 3, \"candidates_token_count\": 4,
                                     \"total_token_count\": 7, \"cost\": 0.0002}}'
         FROM adk_sessions WHERE session_id = 'late-session'",
        &[&event_ts],
    )
    .await
    .expect("the late event");
    let bytes: i32 = sql
        .query_one("SELECT octet_length(payload::text) FROM adk_events WHERE event_id = 'late-1'", &[])
        .await
        .expect("size")
        .get(0);
    rollup(db.url(), &RollupConfig::default()).await;
    let event = OneEvent {
        app: "app-a",
        author: "writer",
        kind: "model_response",
        event_ts,
        bytes,
        prompt: 3,
        candidates: 4,
        total: 7,
        cost: "0.0002",
        with_latency: false,
    };
    assert_changed_by_exactly(&sql, &event, range, true).await;
    let after: i64 =
        count(&sql, &format!("SELECT sum(events)::bigint FROM adk_usage_1d WHERE bucket_start = '{day} 00:00:00+00'"))
            .await;
    assert_eq!(after, before + 1, "the day keeps every event it had");
}

#[tokio::test(flavor = "multi_thread")]
async fn authors_above_the_cap_fold_into_one_row_per_kind_and_keep_totals() {
    let db = test_database().await;
    let sql = db.connect().await;
    let session_day: NaiveDate = sql
        .query_one(
            "INSERT INTO adk_sessions (app_name, user_id, session_id) VALUES ('app-a', 'u1', 's1')
             RETURNING session_day",
            &[],
        )
        .await
        .expect("session")
        .get(0);
    let now = server_now_ns(&sql).await;
    let minute = (now - 10 * NS_PER_MIN).div_euclid(NS_PER_MIN) * NS_PER_MIN;
    let payload = |kind: &str, i: usize| match kind {
        "user_message" => format!(r#"{{"content": {{"role": "user", "parts": [{{"text": "question {i}"}}]}}}}"#),
        "tool_call" => format!(
            r#"{{"content": {{"parts": [{{"name": "search", "args": {{"q": "{i}"}}, "id": "c{i}"}}]}},
                "usage_metadata": {{"prompt_token_count": {i}, "candidates_token_count": 1, "total_token_count": {}}}}}"#,
            i + 1
        ),
        "error" => format!(r#"{{"error_code": "TOOL_TIMEOUT", "error_message": "search timed out ({i})"}}"#),
        "tool_result" => {
            format!(r#"{{"content": {{"parts": [{{"functionResponse": {{"name": "search", "response": {i}}}}}]}}}}"#)
        }
        _ => format!(
            r#"{{"content": {{"parts": [{{"text": "answer {i}"}}]}},
                "usage_metadata": {{"prompt_token_count": 10, "candidates_token_count": {i},
                                    "total_token_count": {}, "cost": 0.00{i}}}}}"#,
            10 + i
        ),
    };
    let mut seq = 0_i64;
    let mut append = async |events: &[(&str, &str, usize)], minute: i64| {
        for (author, kind, times) in events {
            for _ in 0..*times {
                seq += 1;
                let ts = minute + (seq % 50) * NS_PER_SEC;
                sql.execute(
                    "INSERT INTO adk_events (app_name, user_id, session_id, session_day, seq, event_id,
                                             invocation_id, author, event_ts, payload)
                     VALUES ('app-a', 'u1', 's1', $1, $2, 'e' || $2::bigint::text, 'inv', $3, $4, $5::text::jsonb)",
                    &[&session_day, &seq, author, &ts, &payload(kind, seq as usize)],
                )
                .await
                .expect("insert an event");
            }
        }
    };
    // Ranked by events: planner 6, user 5, coder 4, then tester 2 and
    // reviewer 1, who fold.
    append(
        &[
            ("planner", "model_response", 3),
            ("planner", "tool_call", 3),
            ("user", "user_message", 5),
            ("coder", "tool_result", 4),
            ("tester", "model_response", 1),
            ("tester", "tool_call", 1),
            ("reviewer", "model_response", 1),
        ],
        minute,
    )
    .await;
    let config = RollupConfig { author_cap: 3, ..Default::default() };
    let report = rollup(db.url(), &config).await;
    assert_eq!(report.authors_folded, 2, "{report}");

    build_reference(&sql).await;
    for (level, unit) in LEVELS {
        let (differences, _) = level_differences(&sql, level, unit, false).await;
        assert!(differences.is_empty(), "{level}: folding changed a total:\n{}", differences.join("\n"));
        let rows = sql
            .query(
                &format!(
                    "SELECT author, folded, kind, events, folded_authors FROM {} ORDER BY folded, author, kind",
                    level.table()
                ),
                &[],
            )
            .await
            .expect("rows");
        let named: BTreeSet<String> = rows.iter().filter(|r| !r.get::<_, bool>(1)).map(|r| r.get(0)).collect();
        assert_eq!(named, BTreeSet::from(["coder".into(), "planner".into(), "user".into()]), "{level}");
        let mut union = Distinct::default();
        let mut folded_rows = BTreeMap::new();
        for row in rows.iter().filter(|r| r.get::<_, bool>(1)) {
            assert_eq!(row.get::<_, String>(0), "", "{level}: a folded row has no author");
            let sketch: Option<Vec<u8>> = row.get(4);
            let sketch = Distinct::decode("folded_authors", &sketch.expect("a folded row says whom it folds"))
                .expect("a readable folded_authors sketch");
            union.merge(&sketch);
            folded_rows.insert(row.get::<_, String>(2), (row.get::<_, i64>(3), sketch.estimate().round()));
        }
        assert_eq!(
            folded_rows,
            BTreeMap::from([("model_response".into(), (2, 2.0)), ("tool_call".into(), (1, 1.0))]),
            "{level}: one folded row per kind, with the events and authors it folds"
        );
        assert_eq!(union.estimate().round(), 2.0, "{level}: two authors folded in all");
        for row in rows.iter().filter(|r| !r.get::<_, bool>(1)) {
            assert!(row.get::<_, Option<Vec<u8>>>(4).is_none(), "{level}: a named row folds nobody");
        }
    }

    // A folded author becomes the busiest of the same minute in a later
    // run, and the next minute brings a new author: which authors the cap
    // keeps changes, the totals never do.
    append(&[("reviewer", "model_response", 10)], minute).await;
    append(&[("auditor", "tool_call", 2), ("tester", "error", 1), ("user", "user_message", 1)], minute + NS_PER_MIN)
        .await;
    rollup(db.url(), &config).await;
    build_reference(&sql).await;
    for (level, unit) in LEVELS {
        let (differences, _) = level_differences(&sql, level, unit, false).await;
        assert!(differences.is_empty(), "{level}: folding changed a total:\n{}", differences.join("\n"));
        let most = count(
            &sql,
            &format!(
                "SELECT coalesce(max(n), 0) FROM (SELECT count(DISTINCT author) AS n FROM {} WHERE NOT folded
                 GROUP BY app_name, bucket_start) b",
                level.table()
            ),
        )
        .await;
        assert!(most <= 3, "{level}: at most 3 named authors per bucket, found {most}");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_run_with_nothing_new_writes_nothing_and_moves_the_watermark() {
    let db = test_database().await;
    let sql = db.connect().await;
    let now = server_now_ns(&sql).await;
    let today = today_utc(&sql).await;
    let batch = Batch {
        first: 1,
        sessions: 300,
        users: 100,
        session_day: today,
        start_from_ns: now - 6 * NS_PER_HOUR,
        start_span_ns: 5 * NS_PER_HOUR,
        split_after_ns: i64::MAX,
        seed: 0.5,
    };
    generate(&sql, &batch).await;
    insert_sessions(&sql, 1, 300).await;
    let inserted = insert_events(&sql, "true").await;
    let watermark = async || -> Option<DateTime<Utc>> {
        sql.query_one("SELECT watermark FROM adk_usage_state", &[]).await.expect("state").get(0)
    };
    assert_eq!(watermark().await, None, "no run yet");

    let first = rollup(db.url(), &RollupConfig::default()).await;
    assert_eq!((first.window_from, first.events_rolled_up), (None, inserted), "{first}");
    assert_eq!(watermark().await, first.window_to, "the watermark is the run's upper bound");
    assert_levels_exact(&sql, "after the first run").await;

    // Row versions (xmin, ctid) as well as contents: a run with nothing to
    // do must not even rewrite identical rows (WAL, bloat, vacuum).
    let versions = async || -> Vec<String> {
        let mut all = Vec::new();
        for table in ["adk_usage_1m", "adk_usage_1h", "adk_usage_1d", "adk_usage_invocation_tails"] {
            let rows = sql
                .query(
                    &format!("SELECT xmin::text || ' ' || ctid::text || ' ' || t::text FROM {table} t ORDER BY 1"),
                    &[],
                )
                .await
                .expect("row versions");
            all.extend(rows.iter().map(|r| format!("{table} {}", r.get::<_, String>(0))));
        }
        all
    };
    let before = versions().await;
    let mut previous = first;
    for _ in 0..2 {
        let again = rollup(db.url(), &RollupConfig::default()).await;
        assert_eq!(again.window_from, previous.window_to, "starts at the last watermark");
        assert!(again.window_to > again.window_from, "the upper bound moves on: {again:?}");
        assert_eq!(
            (again.events_read, again.events_rolled_up, again.minute_buckets, again.hour_buckets, again.day_buckets),
            (0, 0, 0, 0, 0),
            "{again}"
        );
        assert_eq!(watermark().await, again.window_to, "the watermark advances to the run's window_to");
        assert_eq!(versions().await, before, "a run with nothing new changes no row");
        previous = again;
    }
    let runs = count(&sql, "SELECT count(*) FROM adk_usage_runs WHERE outcome = 'ok'").await;
    assert_eq!(runs, 3, "every run is recorded");
}
