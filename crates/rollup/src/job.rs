//! The rollup run: what arrived since the watermark becomes minute rows,
//! and the hours and days those minutes belong to are recomputed from the
//! level below.
//!
//! Exactness rests on three things:
//! - The window is arrival time (`created_at`), which the events table sets
//!   with `clock_timestamp()` at insert, while the inserting transaction
//!   already holds its write lock on the log. The run picks its upper bound
//!   `T`, then waits until every transaction holding such a lock at that
//!   moment has ended (`pg_locks`, readable without privileges). After
//!   that, no row with `created_at < T` can still commit, so the window
//!   `[watermark, T)` is complete and the next run starts at `T`.
//! - A run is one read-committed transaction (each statement sees what
//!   committed before it, so the events query sees every writer waited
//!   for): its minute rows, hours, days, invocation
//!   tails, late counters and the new watermark commit together or not at
//!   all, so an event is never counted twice or missed across a crash.
//! - Runs never overlap: each locks the single state row, and a second run
//!   that finds it locked reports `skipped`.
//!
//! Late data: an event whose arrival and own time (`event_ts`) are further
//! apart than the policy's lateness window is not rolled up but counted per
//! app and arrival day. An event within the window is merged into its
//! (older) minute, and that minute's hour and day are recomputed from the
//! level below. Minutes are never recomputed from raw events, so a bucket
//! whose raw events retention has dropped is never zeroed.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::time::{Duration, Instant};

use adk_postgres_operations::LockPolicy;
use adk_postgres_operations::connect;
use bigdecimal::BigDecimal;
use chrono::{DateTime, NaiveDate, Utc};
use diesel::QueryableByName;
use diesel::sql_types::{Array, BigInt, Date, Integer, Nullable, Numeric, Text, Timestamptz};
use diesel_async::{AsyncPgConnection, RunQueryDsl, SimpleAsyncConnection};
use futures_util::TryStreamExt;
use serde::Serialize;

use crate::bucket::{Aggregate, Author, BucketKey, EventFacts, Kind, Level, cap_authors};
use crate::error::RollupError;
use crate::rows::{self, Windows};

/// How a run does its work. What counts as late and how long each tier is
/// kept are the store's policy, in the database.
#[derive(Debug, Clone)]
pub struct RollupConfig {
    /// Named authors kept per app and bucket; the rest fold into one row.
    pub author_cap: usize,
    /// Longest the run waits for in-flight writes below its upper bound
    /// before it gives up advancing (and says which are still running).
    pub writer_wait: Duration,
    /// How its partition DDL waits for locks.
    pub lock_policy: LockPolicy,
}

impl Default for RollupConfig {
    fn default() -> Self {
        Self { author_cap: 1_000, writer_wait: Duration::from_secs(30), lock_policy: LockPolicy::default() }
    }
}

/// What one run did.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct RollupReport {
    /// The arrival window read: from the previous watermark (none on the
    /// first run: everything stored) to this run's upper bound.
    pub window_from: Option<DateTime<Utc>>,
    /// The upper bound of the arrival window (exclusive); `None` when the
    /// run was skipped.
    pub window_to: Option<DateTime<Utc>>,
    /// Events that arrived in the window.
    pub events_read: u64,
    /// Of those, events merged into minute rows.
    pub events_rolled_up: u64,
    /// Events outside the lateness window, counted and not rolled up.
    pub late_rejected: u64,
    /// Minute buckets (per app) written.
    pub minute_buckets: usize,
    /// Hour buckets (per app) recomputed from their minutes.
    pub hour_buckets: usize,
    /// Day buckets (per app) recomputed from their hours.
    pub day_buckets: usize,
    /// Named authors folded into `(other)` rows by the cap, over all levels.
    pub authors_folded: usize,
    /// In-flight writers the run waited for before reading.
    pub writers_waited: usize,
    /// Writers still running when the wait ran out: the watermark stayed
    /// where it was.
    pub waiting_on: Vec<String>,
    /// Another run held the state row; this one did nothing.
    pub skipped: bool,
    /// Invocation tails deleted because their sessions' days can take no
    /// more appends under the policy.
    pub tails_pruned: u64,
}

impl RollupReport {
    /// Whether the watermark moved.
    pub fn advanced(&self) -> bool {
        !self.skipped && self.waiting_on.is_empty()
    }
}

impl std::fmt::Display for RollupReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.skipped {
            return f.write_str("another rollup run is in progress; skipped");
        }
        if !self.waiting_on.is_empty() {
            return write!(
                f,
                "rollup waited for writers past its limit and did not advance; still running: {}",
                self.waiting_on.join(", ")
            );
        }
        let bound = |t: Option<DateTime<Utc>>| t.map_or_else(|| "the beginning".to_owned(), |t| t.to_rfc3339());
        write!(
            f,
            "rollup of arrivals from {} to {}: {} event(s) read, {} rolled up, {} rejected as late; \
             {} minute, {} hour, {} day bucket(s) written",
            bound(self.window_from),
            bound(self.window_to),
            self.events_read,
            self.events_rolled_up,
            self.late_rejected,
            self.minute_buckets,
            self.hour_buckets,
            self.day_buckets
        )?;
        if self.authors_folded > 0 {
            write!(f, "\n  {} author(s) above the cap folded into (other)", self.authors_folded)?;
        }
        if self.writers_waited > 0 {
            write!(f, "\n  waited for {} in-flight writer(s)", self.writers_waited)?;
        }
        Ok(())
    }
}

#[derive(QueryableByName)]
struct StateRow {
    #[diesel(sql_type = Nullable<Timestamptz>)]
    watermark: Option<DateTime<Utc>>,
    #[diesel(sql_type = Nullable<Date>)]
    tails_pruned_before: Option<NaiveDate>,
    #[diesel(sql_type = BigInt)]
    lateness_ns: i64,
    #[diesel(sql_type = Date)]
    prune_tails_before: NaiveDate,
}

#[derive(QueryableByName)]
struct ClockRow {
    #[diesel(sql_type = Timestamptz)]
    now: DateTime<Utc>,
}

#[derive(QueryableByName)]
struct WriterRow {
    #[diesel(sql_type = Text)]
    vxid: String,
}

#[derive(QueryableByName)]
struct CountRow {
    #[diesel(sql_type = BigInt)]
    count: i64,
}

#[derive(QueryableByName)]
struct EventRow {
    #[diesel(sql_type = Text)]
    app_name: String,
    #[diesel(sql_type = Text)]
    user_id: String,
    #[diesel(sql_type = Text)]
    session_id: String,
    #[diesel(sql_type = Text)]
    author: String,
    #[diesel(sql_type = Text)]
    kind: String,
    #[diesel(sql_type = BigInt)]
    event_ts: i64,
    #[diesel(sql_type = BigInt)]
    arrived_ns: i64,
    #[diesel(sql_type = Integer)]
    payload_bytes: i32,
    #[diesel(sql_type = BigInt)]
    prompt_tokens: i64,
    #[diesel(sql_type = BigInt)]
    candidates_tokens: i64,
    #[diesel(sql_type = BigInt)]
    total_tokens: i64,
    #[diesel(sql_type = Nullable<Numeric>)]
    cost: Option<BigDecimal>,
    #[diesel(sql_type = Nullable<BigInt>)]
    previous_ts: Option<i64>,
}

/// The events that arrived in `[$1, $2)`, with what each contributes. The
/// previous event of an invocation (for latency) is the one before it in
/// the session's log order: in this batch, else the invocation's tail from
/// earlier runs, else (for sessions whose tails were pruned) the log.
const EVENTS_SQL: &str = "
WITH batch AS (
    SELECT e.app_name, e.user_id, e.session_id, e.session_day, e.seq,
           NULLIF(e.invocation_id, '') AS invocation_id, e.author, e.event_ts, e.created_at, e.payload,
           lag(e.event_ts) OVER w AS previous_in_batch,
           row_number() OVER w AS nth
    FROM adk_events e
    WHERE e.created_at >= coalesce($1, '-infinity') AND e.created_at < $2
    WINDOW w AS (PARTITION BY e.app_name, e.user_id, e.session_id, e.session_day, NULLIF(e.invocation_id, '')
                 ORDER BY e.seq)
)
SELECT b.app_name, b.user_id, b.session_id, b.author,
       adk_usage_kind(b.payload, b.author) AS kind,
       b.event_ts,
       (extract(epoch FROM b.created_at) * 1000000)::bigint * 1000 AS arrived_ns,
       adk_usage_bytes(b.payload) AS payload_bytes,
       adk_usage_tokens(b.payload, 'prompt_token_count', 'promptTokenCount') AS prompt_tokens,
       adk_usage_tokens(b.payload, 'candidates_token_count', 'candidatesTokenCount') AS candidates_tokens,
       adk_usage_tokens(b.payload, 'total_token_count', 'totalTokenCount') AS total_tokens,
       adk_usage_cost(b.payload) AS cost,
       CASE
           WHEN b.invocation_id IS NULL THEN NULL
           WHEN b.nth > 1 THEN b.previous_in_batch
           WHEN b.session_day >= coalesce($3, '-infinity') THEN (
               SELECT t.last_event_ts FROM adk_usage_invocation_tails t
               WHERE t.app_name = b.app_name AND t.user_id = b.user_id AND t.session_id = b.session_id
                 AND t.session_day = b.session_day AND t.invocation_id = b.invocation_id)
           ELSE (
               SELECT p.event_ts FROM adk_events p
               WHERE p.app_name = b.app_name AND p.user_id = b.user_id AND p.session_id = b.session_id
                 AND p.session_day = b.session_day AND p.seq < b.seq AND p.invocation_id = b.invocation_id
               ORDER BY p.seq DESC LIMIT 1)
       END AS previous_ts
FROM batch b";

/// Rolls up everything that arrived since the last run. Safe at any time,
/// against live appends, concurrently with itself (the second run skips)
/// and after a crash at any point (the transaction is rolled back).
pub async fn run_rollup(database_url: &str, config: &RollupConfig) -> Result<RollupReport, RollupError> {
    if config.author_cap < 1 {
        return Err(RollupError::InvalidInput { field: "author_cap", reason: "must be at least 1".into() });
    }
    let mut conn = connect(database_url, "adk-pg rollup", &config.lock_policy).await?;
    // Read committed whatever the database's default: the events query must
    // take its snapshot after the wait for writers, not at the first
    // statement as repeatable read would.
    conn.batch_execute("BEGIN ISOLATION LEVEL READ COMMITTED").await.map_err(RollupError::query("begin the rollup"))?;
    let started = Instant::now();
    let outcome = roll_up(&mut conn, config).await;
    match outcome {
        Ok(report) => {
            conn.batch_execute("COMMIT").await.map_err(RollupError::query("commit the rollup"))?;
            tracing::info!(
                events = report.events_rolled_up,
                late = report.late_rejected,
                elapsed_ms = started.elapsed().as_millis() as u64,
                "rollup run"
            );
            Ok(report)
        }
        Err(error) => {
            let _ = conn.batch_execute("ROLLBACK").await;
            if let Err(record) = record_failure(&mut conn, &error).await {
                tracing::warn!(error = %record, "could not record the failed rollup run");
            }
            Err(error)
        }
    }
}

async fn roll_up(conn: &mut AsyncPgConnection, config: &RollupConfig) -> Result<RollupReport, RollupError> {
    let mut report = RollupReport::default();
    let state = diesel::sql_query(
        "SELECT s.watermark, s.tails_pruned_before,
                (extract(epoch FROM adk_policy_seconds(p.usage_lateness)) * 1000000000)::bigint AS lateness_ns,
                ((now() AT TIME ZONE 'UTC')::date
                 - (extract(epoch FROM adk_policy_seconds(p.max_session_lifetime)) / 86400)::integer - 2)
                    AS prune_tails_before
         FROM adk_usage_state s CROSS JOIN adk_store_policy p
         FOR UPDATE OF s SKIP LOCKED",
    )
    .load::<StateRow>(conn)
    .await
    .map_err(RollupError::query("lock the rollup state"))?
    .into_iter()
    .next();
    let Some(state) = state else {
        report.skipped = true;
        return Ok(report);
    };
    report.window_from = state.watermark;

    let upper = clock(conn).await?;
    report.window_to = Some(upper);
    let (waited, still_running) = wait_for_writers(conn, config.writer_wait).await?;
    report.writers_waited = waited;
    if !still_running.is_empty() {
        report.waiting_on = still_running;
        record_run(conn, &report, "waiting").await?;
        return Ok(report);
    }

    // 1. The window's events, streamed: memory holds buckets, not events.
    let lower = state.watermark;
    let mut minutes: BTreeMap<BucketKey, Aggregate> = BTreeMap::new();
    let mut late: HashMap<(String, NaiveDate), (i64, i64)> = HashMap::new();
    {
        let mut stream = diesel::sql_query(EVENTS_SQL)
            .bind::<Nullable<Timestamptz>, _>(lower)
            .bind::<Timestamptz, _>(upper)
            .bind::<Nullable<Date>, _>(state.tails_pruned_before)
            .load_stream::<EventRow>(conn)
            .await
            .map_err(RollupError::query("read the events that arrived"))?;
        while let Some(event) = stream.try_next().await.map_err(RollupError::query("read the events that arrived"))? {
            report.events_read += 1;
            let distance = event.arrived_ns.saturating_sub(event.event_ts).saturating_abs();
            if distance > state.lateness_ns {
                let day = DateTime::<Utc>::from_timestamp_nanos(event.arrived_ns).date_naive();
                let counter = late.entry((event.app_name, day)).or_insert((0, i64::MIN));
                counter.0 += 1;
                counter.1 = counter.1.max(event.event_ts);
                report.late_rejected += 1;
                continue;
            }
            let kind: Kind = event.kind.parse().map_err(RollupError::Corrupt)?;
            let at = DateTime::<Utc>::from_timestamp_nanos(event.event_ts);
            let session_key = format!("{}\u{1f}{}", event.user_id, event.session_id);
            let facts = EventFacts {
                session_key: &session_key,
                user_id: &event.user_id,
                payload_bytes: event.payload_bytes,
                prompt_tokens: event.prompt_tokens,
                candidates_tokens: event.candidates_tokens,
                total_tokens: event.total_tokens,
                cost: event.cost,
                latency_ms: event.previous_ts.map(|previous| (event.event_ts - previous) as f64 / 1.0e6),
            };
            let key = BucketKey {
                app: event.app_name.clone(),
                start: Level::Minute.bucket_of(at),
                author: Author::Named(event.author.clone()),
                kind,
            };
            minutes.entry(key).or_default().add_event(kind, &facts);
            report.events_rolled_up += 1;
        }
    }

    // 2. Minutes: merged into what earlier runs wrote for the same buckets.
    let touched: BTreeSet<(String, DateTime<Utc>)> = minutes.keys().map(|k| (k.app.clone(), k.start)).collect();
    let mut windows = Windows::default();
    for (app, start) in &touched {
        windows.push(app, *start, *start + Level::Minute.width());
    }
    if !windows.is_empty() {
        ensure_partitions(conn, Level::Minute, touched.iter().map(|(_, start)| *start)).await?;
        for row in rows::load(conn, Level::Minute, &windows).await.map_err(RollupError::query("read minute rows"))? {
            let (key, aggregate) = row.decode().map_err(|e| RollupError::Corrupt(e.to_string()))?;
            minutes.entry(key).or_default().merge(&aggregate);
        }
        report.authors_folded += cap_authors(&mut minutes, config.author_cap);
        rows::replace(conn, Level::Minute, &windows, &minutes)
            .await
            .map_err(RollupError::query("write minute rows"))?;
    }
    report.minute_buckets = touched.len();

    // 3. Hours from minutes, days from hours: each touched bucket recomputed
    //    whole from the level below, never from raw events.
    let mut below = touched;
    for level in [Level::Hour, Level::Day] {
        let source = level.source().unwrap_or(Level::Minute);
        let buckets: BTreeSet<(String, DateTime<Utc>)> =
            below.iter().map(|(app, start)| (app.clone(), level.bucket_of(*start))).collect();
        let mut windows = Windows::default();
        for (app, start) in &buckets {
            windows.push(app, *start, *start + level.width());
        }
        if !windows.is_empty() {
            let mut merged: BTreeMap<BucketKey, Aggregate> = BTreeMap::new();
            let source_rows =
                rows::load(conn, source, &windows).await.map_err(RollupError::query("read rows below"))?;
            for row in source_rows {
                let (key, aggregate) = row.decode().map_err(|e| RollupError::Corrupt(e.to_string()))?;
                let key = BucketKey { start: level.bucket_of(key.start), ..key };
                merged.entry(key).or_default().merge(&aggregate);
            }
            report.authors_folded += cap_authors(&mut merged, config.author_cap);
            ensure_partitions(conn, level, buckets.iter().map(|(_, start)| *start)).await?;
            rows::replace(conn, level, &windows, &merged).await.map_err(RollupError::query("write rollup rows"))?;
        }
        match level {
            Level::Hour => report.hour_buckets = buckets.len(),
            _ => report.day_buckets = buckets.len(),
        }
        below = buckets;
    }

    // 4. Invocation tails, late counters, the watermark: same transaction.
    diesel::sql_query(
        "INSERT INTO adk_usage_invocation_tails AS t
             (app_name, user_id, session_id, session_day, invocation_id, last_seq, last_event_ts)
         SELECT DISTINCT ON (e.app_name, e.user_id, e.session_id, e.session_day, e.invocation_id)
                e.app_name, e.user_id, e.session_id, e.session_day, e.invocation_id, e.seq, e.event_ts
         FROM adk_events e
         WHERE e.created_at >= coalesce($1, '-infinity') AND e.created_at < $2 AND e.invocation_id <> ''
         ORDER BY e.app_name, e.user_id, e.session_id, e.session_day, e.invocation_id, e.seq DESC
         ON CONFLICT (app_name, user_id, session_id, session_day, invocation_id) DO UPDATE
             SET last_seq = EXCLUDED.last_seq, last_event_ts = EXCLUDED.last_event_ts
             WHERE t.last_seq < EXCLUDED.last_seq",
    )
    .bind::<Nullable<Timestamptz>, _>(lower)
    .bind::<Timestamptz, _>(upper)
    .execute(conn)
    .await
    .map_err(RollupError::query("record invocation tails"))?;
    // Sessions of days this old can take no append under today's policy;
    // should the policy be raised, their previous events are looked up in
    // the log itself (`tails_pruned_before`).
    if state.tails_pruned_before.is_none_or(|before| before < state.prune_tails_before) {
        let pruned = diesel::sql_query(
            "WITH gone AS (DELETE FROM adk_usage_invocation_tails WHERE session_day < $1 RETURNING 1)
             SELECT count(*) AS count FROM gone",
        )
        .bind::<Date, _>(state.prune_tails_before)
        .load::<CountRow>(conn)
        .await
        .map_err(RollupError::query("prune invocation tails"))?;
        report.tails_pruned = <[CountRow]>::first(&pruned).map_or(0, |r| u64::try_from(r.count).unwrap_or_default());
    }
    if !late.is_empty() {
        let mut apps = Vec::new();
        let mut days = Vec::new();
        let mut counts = Vec::new();
        let mut last = Vec::new();
        for ((app, day), (count, latest)) in late {
            apps.push(app);
            days.push(day);
            counts.push(count);
            last.push(latest);
        }
        diesel::sql_query(
            "INSERT INTO adk_usage_late_events AS l (app_name, arrival_day, rejected, last_event_ts)
             SELECT * FROM unnest($1::text[], $2::date[], $3::bigint[], $4::bigint[])
             ON CONFLICT (app_name, arrival_day) DO UPDATE
                 SET rejected = l.rejected + EXCLUDED.rejected,
                     last_event_ts = greatest(l.last_event_ts, EXCLUDED.last_event_ts),
                     updated_at = now()",
        )
        .bind::<Array<Text>, _>(apps)
        .bind::<Array<Date>, _>(days)
        .bind::<Array<BigInt>, _>(counts)
        .bind::<Array<BigInt>, _>(last)
        .execute(conn)
        .await
        .map_err(RollupError::query("count late events"))?;
    }
    diesel::sql_query(
        "UPDATE adk_usage_state
         SET watermark = $1, updated_at = now(),
             tails_pruned_before = greatest(tails_pruned_before, $2)",
    )
    .bind::<Timestamptz, _>(upper)
    .bind::<Date, _>(state.prune_tails_before)
    .execute(conn)
    .await
    .map_err(RollupError::query("advance the watermark"))?;
    record_run(conn, &report, "ok").await?;
    // The run log is for status and the dashboard, not an archive: at one
    // run a minute it would otherwise grow by half a million rows a year.
    diesel::sql_query("DELETE FROM adk_usage_runs WHERE finished_at < now() - $1::interval")
        .bind::<Text, _>(RUN_HISTORY)
        .execute(conn)
        .await
        .map_err(RollupError::query("prune the run log"))?;
    Ok(report)
}

/// How long rollup runs stay in `adk_usage_runs`.
const RUN_HISTORY: &str = "30 days";

async fn clock(conn: &mut AsyncPgConnection) -> Result<DateTime<Utc>, RollupError> {
    diesel::sql_query("SELECT clock_timestamp() AS now")
        .load::<ClockRow>(conn)
        .await
        .map_err(RollupError::query("read the clock"))?
        .into_iter()
        .next()
        .map(|row| row.now)
        .ok_or_else(|| RollupError::Corrupt("the clock query returned no row".into()))
}

/// Waits until every transaction that holds a write lock on the event log
/// now has ended. Returns how many there were and those still running
/// when `limit` passed.
async fn wait_for_writers(conn: &mut AsyncPgConnection, limit: Duration) -> Result<(usize, Vec<String>), RollupError> {
    let writers: Vec<String> = diesel::sql_query(
        "SELECT DISTINCT l.virtualtransaction AS vxid
         FROM pg_locks l
         WHERE l.locktype = 'relation' AND l.mode = 'RowExclusiveLock' AND l.pid <> pg_backend_pid()
           AND l.database = (SELECT d.oid FROM pg_database d WHERE d.datname = current_database())
           AND l.relation IN (SELECT t.relid FROM pg_partition_tree('adk_events') t)",
    )
    .load::<WriterRow>(conn)
    .await
    .map_err(RollupError::query("list in-flight writers"))?
    .into_iter()
    .map(|row| row.vxid)
    .collect();
    if writers.is_empty() {
        return Ok((0, Vec::new()));
    }
    let deadline = Instant::now() + limit;
    loop {
        let running: Vec<String> = diesel::sql_query(
            "SELECT l.virtualxid AS vxid FROM pg_locks l
             WHERE l.locktype = 'virtualxid' AND l.virtualxid = ANY ($1)",
        )
        .bind::<Array<Text>, _>(&writers)
        .load::<WriterRow>(conn)
        .await
        .map_err(RollupError::query("wait for in-flight writers"))?
        .into_iter()
        .map(|row| row.vxid)
        .collect();
        if running.is_empty() {
            return Ok((writers.len(), Vec::new()));
        }
        if Instant::now() >= deadline {
            return Ok((writers.len(), running));
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn ensure_partitions(
    conn: &mut AsyncPgConnection,
    level: Level,
    buckets: impl Iterator<Item = DateTime<Utc>>,
) -> Result<(), RollupError> {
    let partitions: BTreeSet<DateTime<Utc>> = buckets.map(|b| level.partition_of(b)).collect();
    for start in partitions {
        diesel::sql_query("SELECT adk_ensure_usage_partition($1, $2) AS made")
            .bind::<Text, _>(level.as_str())
            .bind::<Timestamptz, _>(start)
            .execute(conn)
            .await
            .map_err(RollupError::query("create a rollup partition"))?;
    }
    Ok(())
}

async fn record_run(conn: &mut AsyncPgConnection, report: &RollupReport, outcome: &str) -> Result<(), RollupError> {
    let count = |n: usize| i32::try_from(n).unwrap_or(i32::MAX);
    let big = |n: u64| i64::try_from(n).unwrap_or(i64::MAX);
    diesel::sql_query(
        "INSERT INTO adk_usage_runs
             (started_at, window_from, window_to, events_read, events_rolled, late_rejected,
              minute_buckets, hour_buckets, day_buckets, writers_waited, outcome, error)
         VALUES (now(), $1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)",
    )
    .bind::<Nullable<Timestamptz>, _>(report.window_from)
    .bind::<Nullable<Timestamptz>, _>(report.window_to)
    .bind::<BigInt, _>(big(report.events_read))
    .bind::<BigInt, _>(big(report.events_rolled_up))
    .bind::<BigInt, _>(big(report.late_rejected))
    .bind::<Integer, _>(count(report.minute_buckets))
    .bind::<Integer, _>(count(report.hour_buckets))
    .bind::<Integer, _>(count(report.day_buckets))
    .bind::<Integer, _>(count(report.writers_waited))
    .bind::<Text, _>(outcome)
    .bind::<Nullable<Text>, _>(
        (!report.waiting_on.is_empty()).then(|| format!("writers still running: {}", report.waiting_on.join(", "))),
    )
    .execute(conn)
    .await
    .map_err(RollupError::query("record the rollup run"))?;
    Ok(())
}

async fn record_failure(conn: &mut AsyncPgConnection, error: &RollupError) -> Result<(), diesel::result::Error> {
    diesel::sql_query("INSERT INTO adk_usage_runs (started_at, outcome, error) VALUES (now(), 'failed', $1)")
        .bind::<Text, _>(error.to_string())
        .execute(conn)
        .await
        .map(|_| ())
}
