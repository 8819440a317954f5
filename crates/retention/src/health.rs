//! Health: what an operator (or an alert rule) needs to know about the
//! store at a glance.

use std::time::Duration;

use chrono::{DateTime, NaiveDate, Utc};
use diesel::QueryableByName;
use diesel::sql_types::{BigInt, Date, Integer, Nullable, Text, Timestamptz};
use diesel_async::{AsyncPgConnection, RunQueryDsl};
use serde::Serialize;

use crate::error::RetentionError;
use crate::partitions::{days_ahead, list_orphans, list_partitions};
use crate::policy::{PolicySummary, live_days, retire_before, start_of, store_policy};
use crate::sql::{LockPolicy, connect, events_schema, first_row};

/// When health turns into alerts.
#[derive(Debug, Clone)]
pub struct HealthThresholds {
    /// Alert when fewer future days than this have a partition.
    pub min_partitions_ahead: u32,
    /// Alert when the last successful maintenance run is older than this.
    pub max_run_age: Duration,
}

impl Default for HealthThresholds {
    fn default() -> Self {
        Self { min_partitions_ahead: 3, max_run_age: Duration::from_secs(24 * 3600) }
    }
}

/// The last successful maintenance run.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct LastRun {
    pub finished_at: DateTime<Utc>,
    pub today: NaiveDate,
    pub created: i32,
    pub dropped: i32,
    pub sessions_deleted: i64,
}

/// The most recent maintenance run, when it failed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct FailedRun {
    pub finished_at: DateTime<Utc>,
    pub today: NaiveDate,
    pub error: String,
}

/// An attached partition past lifetime plus retention: maintenance kept it
/// because a session of it is live, or has not run since it became due.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct OverduePartition {
    pub partition: String,
    /// First day it holds; `None` for a legacy `MINVALUE` partition.
    pub from: Option<NaiveDate>,
    /// Open, unexpired sessions of its days active within the retention.
    pub open_sessions: i64,
    pub last_active: Option<DateTime<Utc>>,
}

/// `pg_column_size(state)` over session rows, in bytes.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct StateSizes {
    pub sessions: i64,
    pub p50: Option<i64>,
    pub p90: Option<i64>,
    pub p99: Option<i64>,
    pub max: Option<i64>,
}

/// The health report.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct HealthReport {
    pub today: NaiveDate,
    pub partitions: usize,
    /// Consecutive days after today with a partition.
    pub partitions_ahead: u32,
    pub oldest_partition: Option<String>,
    pub newest_partition: Option<String>,
    pub pending_detaches: Vec<String>,
    /// Partition tables detached but never dropped.
    pub orphaned_partitions: Vec<String>,
    pub last_run: Option<LastRun>,
    /// Set when the most recent maintenance run failed.
    pub last_failure: Option<FailedRun>,
    /// The store's policy, from the database.
    pub policy: PolicySummary,
    /// Days before this one are past lifetime plus retention, judged as of
    /// the day the last maintenance run worked for (or `today`, whichever
    /// is earlier), so a day that only just came due does not alert before
    /// maintenance had its chance.
    pub retire_before: NaiveDate,
    /// Attached partitions past `retire_before`; each is an alert until
    /// maintenance retires it.
    pub overdue_partitions: Vec<OverduePartition>,
    pub session_updates: i64,
    pub session_hot_updates: i64,
    /// HOT share of `adk_sessions` updates; `None` before any update.
    pub hot_ratio: Option<f64>,
    pub state_sizes: StateSizes,
    /// Empty when healthy.
    pub alerts: Vec<String>,
}

impl HealthReport {
    pub fn is_healthy(&self) -> bool {
        self.alerts.is_empty()
    }
}

impl std::fmt::Display for HealthReport {
    /// The `adk-pg status` table, one row per check. The alerts are not in
    /// it: the CLI prints each on a line of its own, for grep and alert
    /// rules.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let list = |names: &[String]| if names.is_empty() { "none".to_owned() } else { names.join(", ") };
        let bytes = |value: Option<i64>| value.map_or_else(|| "-".to_owned(), |v| format!("{v} B"));
        let last_run = self.last_run.as_ref().map_or_else(
            || "never".to_owned(),
            |r| {
                format!(
                    "{} (for {}, {} created, {} dropped)",
                    r.finished_at.format("%Y-%m-%d %H:%M:%S UTC"),
                    r.today,
                    r.created,
                    r.dropped
                )
            },
        );
        let last_failure = self.last_failure.as_ref().map_or_else(
            || "no".to_owned(),
            |r| format!("{} (for {}): {}", r.finished_at.format("%Y-%m-%d %H:%M:%S UTC"), r.today, r.error),
        );
        let kept: Vec<String> = self
            .overdue_partitions
            .iter()
            .map(|p| format!("{} ({} live session(s))", p.partition, p.open_sessions))
            .collect();
        let hot = match self.hot_ratio {
            Some(ratio) => format!("{:.1}% of {}", ratio * 100.0, self.session_updates),
            None => "no updates yet".to_owned(),
        };
        let sizes = &self.state_sizes;
        let rows: [(&str, String); 16] = [
            ("today (UTC)", self.today.to_string()),
            ("partitions", self.partitions.to_string()),
            ("partitions ahead", self.partitions_ahead.to_string()),
            ("oldest partition", self.oldest_partition.clone().unwrap_or_else(|| "-".into())),
            ("newest partition", self.newest_partition.clone().unwrap_or_else(|| "-".into())),
            ("pending detaches", list(&self.pending_detaches)),
            ("orphaned partitions", list(&self.orphaned_partitions)),
            ("last maintenance run", last_run),
            ("last run failed", last_failure),
            ("policy", self.policy.to_string()),
            ("retiring days before", self.retire_before.to_string()),
            ("kept past retention", list(&kept)),
            ("HOT updates (adk_sessions)", hot),
            ("sessions", sizes.sessions.to_string()),
            (
                "state size p50 / p90 / p99 / max",
                format!("{} / {} / {} / {}", bytes(sizes.p50), bytes(sizes.p90), bytes(sizes.p99), bytes(sizes.max)),
            ),
            ("status", if self.is_healthy() { "OK".into() } else { format!("{} alert(s)", self.alerts.len()) }),
        ];
        let mut table = comfy_table::Table::new();
        table.load_style(comfy_table::presets::UTF8_FULL_CONDENSED).set_header(["check", "value"]);
        for (check, value) in rows {
            table.add_row([check.to_owned(), value]);
        }
        write!(f, "{table}")
    }
}

#[derive(QueryableByName)]
struct RunRow {
    #[diesel(sql_type = Timestamptz)]
    finished_at: DateTime<Utc>,
    #[diesel(sql_type = Date)]
    today: NaiveDate,
    #[diesel(sql_type = Integer)]
    created: i32,
    #[diesel(sql_type = Integer)]
    dropped: i32,
    #[diesel(sql_type = BigInt)]
    sessions_deleted: i64,
}

#[derive(QueryableByName)]
struct LatestRow {
    #[diesel(sql_type = Timestamptz)]
    finished_at: DateTime<Utc>,
    #[diesel(sql_type = Date)]
    today: NaiveDate,
    #[diesel(sql_type = Text)]
    outcome: String,
    #[diesel(sql_type = Nullable<Text>)]
    error: Option<String>,
}

#[derive(QueryableByName)]
struct UpdatesRow {
    #[diesel(sql_type = BigInt)]
    updates: i64,
    #[diesel(sql_type = BigInt)]
    hot: i64,
}

#[derive(QueryableByName)]
struct SizesRow {
    #[diesel(sql_type = BigInt)]
    sessions: i64,
    #[diesel(sql_type = Nullable<BigInt>)]
    p50: Option<i64>,
    #[diesel(sql_type = Nullable<BigInt>)]
    p90: Option<i64>,
    #[diesel(sql_type = Nullable<BigInt>)]
    p99: Option<i64>,
    #[diesel(sql_type = Nullable<BigInt>)]
    max: Option<i64>,
}

#[derive(QueryableByName)]
struct NowRow {
    #[diesel(sql_type = Timestamptz)]
    now: DateTime<Utc>,
}

/// Reads health as of `today` (UTC).
pub async fn health(
    database_url: &str,
    today: NaiveDate,
    thresholds: &HealthThresholds,
) -> Result<HealthReport, RetentionError> {
    let mut conn = connect(database_url, "adk-pg status", &LockPolicy::default()).await?;
    health_on(&mut conn, today, thresholds).await
}

pub async fn health_on(
    conn: &mut AsyncPgConnection,
    today: NaiveDate,
    thresholds: &HealthThresholds,
) -> Result<HealthReport, RetentionError> {
    let schema = events_schema(conn).await?;
    let partitions = list_partitions(conn).await?;
    let orphaned_partitions = list_orphans(conn, &schema).await?;
    let policy = store_policy(conn).await?;
    let last_run = diesel::sql_query(
        "SELECT finished_at, today, created, dropped, sessions_deleted FROM adk_maintenance_runs
         WHERE outcome = 'ok' ORDER BY run_id DESC LIMIT 1",
    )
    .load::<RunRow>(conn)
    .await
    .map_err(RetentionError::query("read the last maintenance run"))?
    .into_iter()
    .next()
    .map(|r| LastRun {
        finished_at: r.finished_at,
        today: r.today,
        created: r.created,
        dropped: r.dropped,
        sessions_deleted: r.sessions_deleted,
    });
    let latest = diesel::sql_query(
        "SELECT finished_at, today, outcome, error FROM adk_maintenance_runs ORDER BY run_id DESC LIMIT 1",
    )
    .load::<LatestRow>(conn)
    .await
    .map_err(RetentionError::query("read the latest maintenance run"))?
    .into_iter()
    .next();
    let last_failure = latest.as_ref().filter(|r| r.outcome != "ok").map(|r| FailedRun {
        finished_at: r.finished_at,
        today: r.today,
        error: r.error.clone().unwrap_or_default(),
    });
    let updates = diesel::sql_query(
        "SELECT coalesce(sum(n_tup_upd), 0)::bigint AS updates, coalesce(sum(n_tup_hot_upd), 0)::bigint AS hot
         FROM pg_stat_user_tables WHERE relid = to_regclass('adk_sessions')",
    )
    .load::<UpdatesRow>(conn)
    .await
    .and_then(first_row)
    .map_err(RetentionError::query("read update statistics"))?;
    // Bounded, so a status call stays cheap on a table of millions of sessions.
    let sizes = diesel::sql_query(
        "SELECT count(*) AS sessions,
                percentile_disc(0.5) WITHIN GROUP (ORDER BY size)::bigint AS p50,
                percentile_disc(0.9) WITHIN GROUP (ORDER BY size)::bigint AS p90,
                percentile_disc(0.99) WITHIN GROUP (ORDER BY size)::bigint AS p99,
                max(size)::bigint AS max
         FROM (SELECT pg_column_size(state) AS size FROM adk_sessions LIMIT 100000) s",
    )
    .load::<SizesRow>(conn)
    .await
    .and_then(first_row)
    .map_err(RetentionError::query("measure state sizes"))?;
    let now = diesel::sql_query("SELECT now() AS now")
        .load::<NowRow>(conn)
        .await
        .and_then(first_row)
        .map_err(RetentionError::query("read the clock"))?
        .now;

    let judged = latest.as_ref().map_or(today, |run| run.today.min(today));
    let retire_before = retire_before(&policy, judged);
    let mut overdue_partitions = Vec::new();
    let overdue: Vec<_> =
        partitions.iter().filter(|p| !p.detach_pending && p.to.is_some_and(|to| to <= retire_before)).collect();
    if !overdue.is_empty() {
        let live = live_days(conn, retire_before, start_of(judged), policy.retention).await?;
        for partition in overdue {
            let holding: Vec<_> = live.iter().filter(|day| partition.holds(day.day)).collect();
            overdue_partitions.push(OverduePartition {
                partition: partition.name.clone(),
                from: partition.from,
                open_sessions: holding.iter().map(|day| day.open_sessions).sum(),
                last_active: holding.iter().map(|day| day.last_active).max(),
            });
        }
    }

    let live: Vec<_> = partitions.iter().filter(|p| !p.detach_pending).cloned().collect();
    let partitions_ahead = days_ahead(&live, today);
    let mut alerts = Vec::new();
    if !live.iter().any(|p| p.holds(today)) {
        alerts.push(format!("no partition for today ({today}): appends to new sessions fail"));
    }
    if partitions_ahead < thresholds.min_partitions_ahead {
        alerts.push(format!(
            "only {partitions_ahead} future day(s) have a partition (want at least {}); run adk-pg maintain",
            thresholds.min_partitions_ahead
        ));
    }
    match &last_run {
        None => alerts.push("maintenance has never run".to_owned()),
        Some(run) => {
            let age = now.signed_duration_since(run.finished_at).to_std().unwrap_or_default();
            if age > thresholds.max_run_age {
                alerts.push(format!("the last maintenance run finished {}s ago", age.as_secs()));
            }
        }
    }
    if let Some(failure) = &last_failure {
        alerts.push(format!(
            "the last maintenance run (for {}) failed at {}: {}",
            failure.today,
            failure.finished_at.format("%Y-%m-%d %H:%M:%S UTC"),
            failure.error
        ));
    }
    for overdue in &overdue_partitions {
        alerts.push(match overdue.last_active {
            Some(last_active) => format!(
                "{} is past lifetime + retention (days before {retire_before} are retired) but kept: {} live \
                 session(s), last active {}; it is retired once they close, expire or stay idle for the retention",
                overdue.partition,
                overdue.open_sessions,
                last_active.format("%Y-%m-%d %H:%M:%S UTC")
            ),
            None => format!(
                "{} is past lifetime + retention (days before {retire_before} are retired); run adk-pg maintain",
                overdue.partition
            ),
        });
    }
    let pending_detaches: Vec<String> =
        partitions.iter().filter(|p| p.detach_pending).map(|p| p.name.clone()).collect();
    if !pending_detaches.is_empty() {
        alerts.push(format!("detaches left pending by an interrupted run: {}", pending_detaches.join(", ")));
    }

    Ok(HealthReport {
        today,
        partitions: partitions.len(),
        partitions_ahead,
        oldest_partition: <[_]>::first(&partitions).map(|p| p.name.clone()),
        newest_partition: <[_]>::last(&partitions).map(|p| p.name.clone()),
        pending_detaches,
        orphaned_partitions,
        last_run,
        last_failure,
        policy: PolicySummary::of(&policy),
        retire_before,
        overdue_partitions,
        session_updates: updates.updates,
        session_hot_updates: updates.hot,
        hot_ratio: (updates.updates > 0).then(|| updates.hot as f64 / updates.updates as f64),
        state_sizes: StateSizes {
            sessions: sizes.sessions,
            p50: sizes.p50,
            p90: sizes.p90,
            p99: sizes.p99,
            max: sizes.max,
        },
        alerts,
    })
}
