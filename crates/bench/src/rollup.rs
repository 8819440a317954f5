//! Usage rollups: how fast `run_rollup` turns a backlog of events into
//! minute, hour and day rows, and how much WAL it writes doing so.
//!
//! A database of its own is seeded as the owner with `INSERT … SELECT`
//! (untimed: the bench measures the rollup, not the append) with traffic
//! shaped like an agent service's: several apps of different sizes, three
//! agents per app, users with several sessions, sessions of ten invocations
//! (the user's message, a tool call, the tool's result, the answer), model
//! events carrying `usage_metadata` tokens and cost as adk-rust writes them,
//! about 1 % of answers errors, latencies of hundreds of milliseconds to
//! seconds between an invocation's events, and arrival a few milliseconds
//! after each event's own time, in arrival order.
//!
//! Each measured run starts from an empty rollup (levels, tails and
//! watermark reset) and a checkpoint, so every run does the same work and
//! its WAL is its own; the figure is the median run. A last run then rolls
//! up only what arrived after: a minute's worth of the same traffic, as a
//! `--every 1m` schedule would see it.

use std::time::Instant;

use adk_postgres_rollup::{RollupConfig, RollupReport, run_rollup};
use anyhow::{Context as _, ensure};
use chrono::Utc;
use serde::Serialize;
use tokio_postgres::Client;

use crate::cpu::CpuClock;
use crate::pgstat::{wal_lsn, wal_since};
use crate::server::connect;

/// Apps of the seeded traffic, and the share of sessions (in tenths) each gets.
const APPS: [(&str, u32); 4] = [("support-bot", 5), ("sales-assistant", 3), ("travel-planner", 1), ("hr-helper", 1)];
/// Agents of every app; each invocation is answered by one of them.
const AGENTS: [&str; 3] = ["triage", "support", "billing"];
/// Events per session: ten invocations of four events.
const EVENTS_PER_SESSION: i64 = 40;
/// Sessions per user.
const SESSIONS_PER_USER: i64 = 5;
/// Minutes over which the backlog's sessions start.
const SPAN_MINUTES: i64 = 120;

/// One measured run.
#[derive(Debug, Clone, Serialize)]
pub struct RollupRun {
    pub events: u64,
    pub secs: f64,
    pub events_per_sec: f64,
    pub wal_bytes: i64,
    pub wal_bytes_per_event: f64,
    /// CPU of this process, where the rollup job runs (streaming rows,
    /// sketches, merges, encoding), during the run; the server's work
    /// overlaps it.
    pub job_cpu_secs: f64,
    /// Rows of each level after the run (the levels were empty before it,
    /// except for the incremental run).
    pub minute_rows: i64,
    pub hour_rows: i64,
    pub day_rows: i64,
    /// On-disk size (tables and indexes) of each level and of the
    /// invocation tails after the run.
    pub sizes: RollupSizes,
    /// What `run_rollup` reported.
    pub report: RollupReport,
}

/// Bytes on disk, tables and indexes, every partition included.
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct RollupSizes {
    pub minute_bytes: i64,
    pub hour_bytes: i64,
    pub day_bytes: i64,
    pub invocation_tails_bytes: i64,
}

#[derive(Debug, Clone, Serialize)]
pub struct RollupBenchReport {
    /// The backlog each measured run rolls up.
    pub events: i64,
    pub apps: usize,
    pub agents_per_app: usize,
    pub users: i64,
    pub sessions: i64,
    pub invocations: i64,
    pub span_minutes: i64,
    /// Seconds the untimed seeding took (inserts, then VACUUM ANALYZE).
    pub seed_secs: f64,
    /// The backlog runs, in order.
    pub runs: Vec<RollupRun>,
    /// Median over `runs` of the wall time, events/s and WAL.
    pub median_secs: f64,
    pub median_events_per_sec: f64,
    pub median_wal_bytes: i64,
    pub median_wal_bytes_per_event: f64,
    /// A run of what arrived after the backlog: a minute of the same traffic.
    pub incremental: Option<RollupRun>,
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    match values.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => values[n / 2],
        n => (values[n / 2 - 1] + values[n / 2]) / 2.0,
    }
}

/// Seeds `sessions` sessions (ids from `first`) whose events are spread as
/// described above; sessions start in `[start_ns, start_ns + span_ns)`
/// (nanoseconds since the epoch). `explicit_arrival` sets `created_at` a few
/// milliseconds after each event (rows inserted in that order); otherwise
/// it is the moment of the insert, as the column's default has it.
async fn seed(
    sql: &Client,
    first: i64,
    sessions: i64,
    start_ns: i64,
    span_ns: i64,
    explicit_arrival: bool,
) -> anyhow::Result<()> {
    // The app of a session: the app whose share its tenth (s % 10) falls in.
    let mut app_case = String::from("CASE");
    let mut upper = 0;
    for (name, share) in APPS {
        upper += share;
        app_case.push_str(&format!(" WHEN s % 10 < {upper} THEN '{name}'"));
    }
    app_case.push_str(" END");
    let agents: Vec<String> = AGENTS.iter().map(|a| (*a).to_owned()).collect();
    sql.batch_execute("DROP TABLE IF EXISTS bench_rollup_sessions").await?;
    sql.execute(
        &format!(
            "CREATE TEMP TABLE bench_rollup_sessions AS
             SELECT s, app, 'user-' || (s / $3) AS user_id, 'session-' || s AS session_id,
                    start_ns, (to_timestamp(start_ns / 1e9) AT TIME ZONE 'UTC')::date AS session_day
             FROM (SELECT s, {app_case} AS app,
                          $4::bigint + (hashint8(s) & 2147483647)::bigint * ($5::bigint / 2147483647) AS start_ns
                   FROM generate_series($1::bigint, $1::bigint + $2::bigint - 1) s) x"
        ),
        &[&first, &sessions, &SESSIONS_PER_USER, &start_ns, &span_ns],
    )
    .await
    .context("choosing the sessions")?;
    let days: Vec<chrono::NaiveDate> = sql
        .query("SELECT DISTINCT session_day FROM bench_rollup_sessions", &[])
        .await?
        .iter()
        .map(|row| row.get(0))
        .collect();
    for day in days {
        sql.execute("SELECT adk_ensure_event_partition($1)", &[&day]).await?;
    }
    sql.execute(
        "INSERT INTO adk_sessions (app_name, user_id, session_id, session_day, last_seq, state, created_at, updated_at)
         SELECT app, user_id, session_id, session_day, $1, '{\"channel\": \"web\"}',
                to_timestamp(start_ns / 1e9), to_timestamp(start_ns / 1e9) + interval '5 minutes'
         FROM bench_rollup_sessions",
        &[&EVENTS_PER_SESSION],
    )
    .await
    .context("inserting the sessions")?;
    // Per invocation: when it starts (every 30 s plus up to 20 s), then the
    // gaps before the tool call (0.3-1.5 s), the tool's result (50-300 ms)
    // and the answer (0.5-3 s). Model events carry usage_metadata; the
    // prompt grows with the conversation.
    // Arrival a few milliseconds after the event, or (the column's
    // default) the moment of the insert.
    let arrival = if explicit_arrival {
        "to_timestamp(e.ts / 1e9) + make_interval(secs => 0.005 + (hashint8(e.ts) & 1023) / 25600.0)"
    } else {
        "clock_timestamp()"
    };
    let order = if explicit_arrival { "ORDER BY e.ts" } else { "" };
    let columns = "app_name, user_id, session_id, session_day, seq, event_id, invocation_id, author, event_ts, \
                   created_at, payload";
    let select = format!(
        "SELECT s.app, s.user_id, s.session_id, s.session_day, e.n + 1, 'e-' || (e.n + 1), e.inv_id, e.author, e.ts,
                {arrival},
                jsonb_strip_nulls(jsonb_build_object(
                    'id', 'e-' || (e.n + 1),
                    'invocation_id', e.inv_id,
                    'author', e.author,
                    'timestamp', to_char(to_timestamp(e.ts / 1e9) AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.US\"Z\"'),
                    'content', jsonb_build_object(
                        'role', CASE WHEN e.pos = 0 THEN 'user' ELSE 'model' END,
                        'parts', CASE e.pos
                            WHEN 1 THEN jsonb_build_array(jsonb_build_object(
                                'id', 'call-' || e.inv, 'name', 'lookup_order',
                                'args', jsonb_build_object('order', 'A-' || (s.s * 10 + e.inv))))
                            WHEN 2 THEN jsonb_build_array(jsonb_build_object('function_response', jsonb_build_object(
                                'id', 'call-' || e.inv, 'name', 'lookup_order',
                                'response', jsonb_build_object('status', 'shipped', 'eta', 'tomorrow 9-12'))))
                            ELSE jsonb_build_array(jsonb_build_object('text', repeat(md5(e.inv_id || e.n), 6)))
                        END),
                    'actions', jsonb_build_object('state_delta', jsonb_build_object('turn', e.inv)),
                    'turn_complete', CASE WHEN e.pos = 3 THEN true END,
                    'error_code', CASE WHEN e.failed THEN 'RESOURCE_EXHAUSTED' END,
                    'error_message', CASE WHEN e.failed THEN 'quota exceeded, retry later' END,
                    'usage_metadata', CASE WHEN e.pos IN (1, 3) AND NOT e.failed THEN jsonb_build_object(
                        'prompt_token_count', e.prompt,
                        'candidates_token_count', e.candidates,
                        'total_token_count', e.prompt + e.candidates,
                        'cost', round((e.prompt * 0.30 + e.candidates * 2.50) / 1000000.0, 8)) END))
         FROM bench_rollup_sessions s
         CROSS JOIN LATERAL (
             SELECT g.n, g.inv, g.pos, s.session_id || '-inv-' || g.inv AS inv_id,
                    CASE WHEN g.pos = 0 THEN 'user' ELSE ($1::text[])[(1 + (s.s + g.inv) % cardinality($1::text[]))::int] END AS author,
                    g.pos = 3 AND (hashint8(s.s * 100 + g.inv) & 127) = 0 AS failed,
                    600 + g.inv * 180 + CASE WHEN g.pos = 3 THEN 60 ELSE 0 END
                        + (hashint8(s.s * 1000 + g.n) & 255) AS prompt,
                    CASE WHEN g.pos = 1 THEN 15 + (hashint8(s.s * 1000 + g.n + 7) & 31)
                         ELSE 40 + (hashint8(s.s * 1000 + g.n + 7) & 255) END AS candidates,
                    s.start_ns + g.inv * 30000000000
                        + (hashint8(s.s * 100 + g.inv) & 2147483647)::bigint % 20000000000
                        + CASE WHEN g.pos >= 1 THEN 300000000 + (hashint8(s.s * 100 + g.inv + 1) & 1023)::bigint * 1200000 ELSE 0 END
                        + CASE WHEN g.pos >= 2 THEN 50000000 + (hashint8(s.s * 100 + g.inv + 2) & 1023)::bigint * 250000 ELSE 0 END
                        + CASE WHEN g.pos >= 3 THEN 500000000 + (hashint8(s.s * 100 + g.inv + 3) & 1023)::bigint * 2500000 ELSE 0 END
                        AS ts
             FROM (SELECT n, n / 4 AS inv, n % 4 AS pos FROM generate_series(0, $2::int - 1) n) g) e
         {order}"
    );
    sql.batch_execute("SET work_mem = '256MB'").await?;
    sql.execute(&format!("INSERT INTO adk_events ({columns}) {select}"), &[&agents, &(EVENTS_PER_SESSION as i32)])
        .await
        .context("inserting the events")?;
    sql.batch_execute("RESET work_mem; DROP TABLE bench_rollup_sessions").await?;
    Ok(())
}

/// Empties every level, the invocation tails, the late counters and the
/// watermark: the next run rolls up everything stored.
async fn reset(sql: &Client) -> anyhow::Result<()> {
    sql.batch_execute(
        "TRUNCATE adk_usage_1m, adk_usage_1h, adk_usage_1d, adk_usage_invocation_tails, adk_usage_late_events;
         UPDATE adk_usage_state SET watermark = NULL, tails_pruned_before = NULL, updated_at = now()",
    )
    .await?;
    Ok(())
}

async fn level_rows(sql: &Client) -> anyhow::Result<(i64, i64, i64, i64)> {
    let row = sql
        .query_one(
            "SELECT (SELECT count(*) FROM adk_usage_1m), (SELECT count(*) FROM adk_usage_1h),
                    (SELECT count(*) FROM adk_usage_1d), (SELECT coalesce(sum(events), 0)::bigint FROM adk_usage_1d)",
            &[],
        )
        .await?;
    Ok((row.get(0), row.get(1), row.get(2), row.get(3)))
}

async fn sizes(sql: &Client) -> anyhow::Result<RollupSizes> {
    let row = sql
        .query_one(
            "SELECT (SELECT coalesce(sum(pg_total_relation_size(relid)), 0)::bigint
                     FROM pg_partition_tree('adk_usage_1m')),
                    (SELECT coalesce(sum(pg_total_relation_size(relid)), 0)::bigint
                     FROM pg_partition_tree('adk_usage_1h')),
                    (SELECT coalesce(sum(pg_total_relation_size(relid)), 0)::bigint
                     FROM pg_partition_tree('adk_usage_1d')),
                    pg_total_relation_size('adk_usage_invocation_tails')",
            &[],
        )
        .await?;
    Ok(RollupSizes {
        minute_bytes: row.get(0),
        hour_bytes: row.get(1),
        day_bytes: row.get(2),
        invocation_tails_bytes: row.get(3),
    })
}

/// One timed run from a checkpoint.
async fn measured_run(url: &str, sql: &Client) -> anyhow::Result<RollupRun> {
    sql.batch_execute("CHECKPOINT").await?;
    let start = wal_lsn(sql).await?;
    let began = Instant::now();
    let cpu = CpuClock::now();
    let report = run_rollup(url, &RollupConfig::default()).await.context("run_rollup")?;
    let job_cpu_secs = CpuClock::now().own_since(&cpu).as_secs_f64();
    let secs = began.elapsed().as_secs_f64();
    let wal_bytes = wal_since(sql, &start).await?;
    ensure!(report.advanced(), "the rollup run did not advance: {report}");
    let (minute_rows, hour_rows, day_rows, _) = level_rows(sql).await?;
    let events = report.events_rolled_up;
    Ok(RollupRun {
        events,
        secs,
        events_per_sec: events as f64 / secs.max(f64::MIN_POSITIVE),
        wal_bytes,
        wal_bytes_per_event: wal_bytes as f64 / events.max(1) as f64,
        job_cpu_secs,
        minute_rows,
        hour_rows,
        day_rows,
        sizes: sizes(sql).await?,
        report,
    })
}

/// Seeds about `events` events into the freshly migrated database at `url`
/// (as its owner), rolls them up `runs` times from scratch, then once
/// incrementally.
pub async fn measure(url: &str, events: usize, runs: usize) -> anyhow::Result<RollupBenchReport> {
    let sql = connect(url).await?;
    let sessions = (events as i64 / EVENTS_PER_SESSION).max(1);
    let events = sessions * EVENTS_PER_SESSION;
    let now_ns = Utc::now().timestamp_nanos_opt().context("the clock is out of range")?;
    let minute_ns = 60_000_000_000_i64;
    // Sessions last about five minutes; the last ends a few minutes ago.
    let start_ns = now_ns - (SPAN_MINUTES + 5) * minute_ns;
    let span_ns = (SPAN_MINUTES - 7) * minute_ns;
    let seeding = Instant::now();
    seed(&sql, 0, sessions, start_ns, span_ns, true).await?;
    sql.batch_execute("VACUUM (ANALYZE) adk_events, adk_sessions").await?;
    let seed_secs = seeding.elapsed().as_secs_f64();
    let stored: i64 = sql.query_one("SELECT count(*) FROM adk_events", &[]).await?.get(0);
    ensure!(stored == events, "seeded {stored} events, expected {events}");

    let mut measured = Vec::new();
    for _ in 0..runs.max(1) {
        reset(&sql).await?;
        let run = measured_run(url, &sql).await?;
        let (_, _, _, day_events) = level_rows(&sql).await?;
        ensure!(
            run.report.events_rolled_up as i64 == events && run.report.late_rejected == 0 && day_events == events,
            "the rollup counted {} events ({} late, {day_events} in the day rows), {events} were stored",
            run.report.events_rolled_up,
            run.report.late_rejected
        );
        measured.push(run);
    }

    // What a schedule of one run a minute sees next: a minute of the same
    // traffic (by count), arriving now.
    let minute_sessions = (sessions / SPAN_MINUTES).max(1);
    let now_ns = Utc::now().timestamp_nanos_opt().context("the clock is out of range")?;
    seed(&sql, sessions, minute_sessions, now_ns - 6 * minute_ns, minute_ns, false).await?;
    let incremental = measured_run(url, &sql).await?;
    ensure!(
        incremental.report.events_rolled_up as i64 == minute_sessions * EVENTS_PER_SESSION,
        "the incremental run rolled up {} events, {} arrived",
        incremental.report.events_rolled_up,
        minute_sessions * EVENTS_PER_SESSION
    );

    let pick = |f: fn(&RollupRun) -> f64| median(measured.iter().map(f).collect());
    Ok(RollupBenchReport {
        events,
        apps: APPS.len(),
        agents_per_app: AGENTS.len(),
        users: (sessions + SESSIONS_PER_USER - 1) / SESSIONS_PER_USER,
        sessions,
        invocations: sessions * EVENTS_PER_SESSION / 4,
        span_minutes: SPAN_MINUTES,
        seed_secs,
        median_secs: pick(|r| r.secs),
        median_events_per_sec: pick(|r| r.events_per_sec),
        median_wal_bytes: pick(|r| r.wal_bytes as f64) as i64,
        median_wal_bytes_per_event: pick(|r| r.wal_bytes_per_event),
        runs: measured,
        incremental: Some(incremental),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn medians() {
        assert_eq!(median(vec![3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(vec![4.0, 1.0, 2.0, 3.0]), 2.5);
        assert!(median(Vec::new()).is_nan());
    }

    #[test]
    fn app_shares_are_tenths() {
        assert_eq!(APPS.iter().map(|(_, share)| share).sum::<u32>(), 10);
    }
}
