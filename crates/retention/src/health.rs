//! Health: what an operator (or an alert rule) needs to know about the
//! store at a glance.
//!
//! The usage rollups (migration 12) add their own facts and alerts:
//! - lag: the clock minus the rollup watermark, alerted above
//!   `max_rollup_lag`. Before the first successful run there is no
//!   watermark; then the alert is "rollups have never run", raised only once
//!   an event arrived longer than `max_rollup_lag` ago, so a fresh database,
//!   or one whose first events are younger than a scheduled run's interval,
//!   does not alert.
//! - the latest run: alerted while it is `failed` or `waiting` (it could not
//!   advance past writers still running); the next good run clears it.
//! - late events: alerted while more events arriving on `today` (UTC) were
//!   rejected as late than `max_late_rejected_today` (0 by default: any).
//!   The count is per arrival day, so the alert clears at midnight UTC;
//!   yesterday's count is shown for context and never alerts.
//! - sizes of the three tiers and minute partitions premade after today:
//!   facts only, since the rollup job makes any partition it lacks.
//!
//! Every alert is typed ([`Alert`]: the check that fired, its area, its
//! severity), so a dashboard colours its cards by exactly the rules
//! `status` alerts on; `alerts` keeps the lines `status` prints.

mod alert;
mod nodes;

pub use alert::{Alert, AlertArea, Check, Severity};
pub use nodes::NodeFacts;

use std::time::Duration;

use std::collections::BTreeSet;

use adk_postgres_schema::names::{USAGE_DAYS, USAGE_HOURS, USAGE_MINUTES};
use adk_postgres_schema::quote::quote_ident;
use chrono::{DateTime, Days, NaiveDate, TimeDelta, Utc};
use diesel::QueryableByName;
use diesel::sql_types::{BigInt, Bool, Date, Integer, Nullable, Text, Timestamptz};
use diesel_async::{AsyncPgConnection, RunQueryDsl};
use serde::Serialize;

use crate::RetentionError;
use crate::partitions::{days_ahead, list_orphans, list_partitions};
use crate::policy::{PolicySummary, live_days, retire_before, start_of, store_policy, usage_policy};
use adk_postgres_operations::{LockPolicy, connect, events_schema, first_row, on_citus};

/// When health turns into alerts.
#[derive(Debug, Clone)]
pub struct HealthThresholds {
    /// Alert when fewer future days than this have a partition.
    pub min_partitions_ahead: u32,
    /// Alert when the last successful maintenance run is older than this.
    pub max_run_age: Duration,
    /// Alert when the rollup watermark is further behind the clock than
    /// this, or, before the first run, an event arrived longer ago.
    pub max_rollup_lag: Duration,
    /// Alert when more events arriving today (UTC) than this were rejected
    /// as late by the rollups.
    pub max_late_rejected_today: u64,
}

impl Default for HealthThresholds {
    fn default() -> Self {
        Self {
            min_partitions_ahead: 3,
            max_run_age: Duration::from_secs(24 * 3600),
            max_rollup_lag: Duration::from_secs(15 * 60),
            max_late_rejected_today: 0,
        }
    }
}

/// The latest rollup run, whatever its outcome.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct RollupRun {
    /// When it ended.
    pub finished_at: DateTime<Utc>,
    /// `ok`, `failed` or `waiting` (writers outlived its wait; it did not
    /// advance).
    pub outcome: String,
    /// Events it merged into minute rows.
    pub events_rolled_up: i64,
    /// Events it counted as late instead of rolling up.
    pub late_rejected: i64,
    /// Why it failed; `None` unless it did.
    pub error: Option<String>,
}

/// One rollup level's storage.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct RollupTier {
    /// `1m`, `1h` or `1d`.
    pub level: String,
    /// Partitions the level has.
    pub partitions: i64,
    /// `pg_total_relation_size` summed over its partitions.
    pub bytes: i64,
}

/// Late rejections of one app on one arrival day.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct LateApp {
    /// The app.
    pub app: String,
    /// Its events rejected as late.
    pub rejected: i64,
}

/// The usage rollups' state.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct RollupHealth {
    /// Every event that arrived before this is rolled up (or counted as
    /// late); `None` before the first successful run.
    pub watermark: Option<DateTime<Utc>>,
    /// The clock minus the watermark.
    /// `None` before the first successful run.
    pub lag_secs: Option<u64>,
    /// Before the first run: whether an event arrived longer than
    /// `max_rollup_lag` ago and is waiting for it.
    pub overdue_events: bool,
    /// The latest run, whatever its outcome; `None` before the first.
    pub last_run: Option<RollupRun>,
    /// Events arriving on `today` (UTC) that were rejected as late.
    pub late_rejected_today: i64,
    /// The same for the day before.
    pub late_rejected_yesterday: i64,
    /// The apps with the most late rejections today, at most five.
    pub late_apps_today: Vec<LateApp>,
    /// Each level's storage: minutes, hours, days.
    pub tiers: Vec<RollupTier>,
    /// Consecutive days after today with a minute partition.
    pub minute_partitions_ahead: u32,
}

/// The archive tier's state.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ArchiveHealth {
    /// The policy, as `adk-pg policy show` prints it.
    pub policy: String,
    /// Whether the policy names a destination, so covered days are archived
    /// before they are dropped.
    pub on: bool,
    /// Objects in the catalog.
    pub objects: i64,
    /// Their bytes in all.
    pub bytes: i64,
    /// The app days they hold.
    pub days: i64,
    /// When the newest object was written and read back.
    pub last_success: Option<DateTime<Utc>>,
    /// App days that failed to archive and are still kept, with the latest
    /// reason.
    pub pending: Vec<PendingArchive>,
    /// Every failed attempt on record.
    pub failures: i64,
}

/// An app's day kept because its archive failed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, QueryableByName)]
pub struct PendingArchive {
    /// The app.
    #[diesel(sql_type = Text)]
    pub app_name: String,
    /// The partition day (UTC).
    #[diesel(sql_type = Date)]
    pub day: NaiveDate,
    /// When the latest attempt failed.
    #[diesel(sql_type = Timestamptz)]
    pub failed_at: DateTime<Utc>,
    /// Why it failed.
    #[diesel(sql_type = Text)]
    pub error: String,
}

/// The last successful maintenance run.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct LastRun {
    /// When it ended.
    pub finished_at: DateTime<Utc>,
    /// The day (UTC) it worked for.
    pub today: NaiveDate,
    /// Partitions it created.
    pub created: i32,
    /// Partitions it dropped.
    pub dropped: i32,
    /// Session rows it deleted with the days it retired.
    pub sessions_deleted: i64,
}

/// The most recent maintenance run, when it failed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct FailedRun {
    /// When it ended.
    pub finished_at: DateTime<Utc>,
    /// The day (UTC) it worked for.
    pub today: NaiveDate,
    /// Why it failed.
    pub error: String,
}

/// An attached partition past lifetime plus retention: maintenance kept it
/// because a session of it is live, or has not run since it became due.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct OverduePartition {
    /// The partition's table name.
    pub partition: String,
    /// First day it holds; `None` for a legacy `MINVALUE` partition.
    pub from: Option<NaiveDate>,
    /// Open, unexpired sessions of its days active within the retention.
    pub open_sessions: i64,
    /// The latest update of those sessions; `None` when there are none.
    pub last_active: Option<DateTime<Utc>>,
}

/// `pg_column_size(state)` over session rows, in bytes.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct StateSizes {
    /// Session rows measured: at most the first 100,000 read.
    pub sessions: i64,
    /// Median size; `None` when there are no sessions.
    pub p50: Option<i64>,
    /// 90th percentile; `None` when there are no sessions.
    pub p90: Option<i64>,
    /// 99th percentile; `None` when there are no sessions.
    pub p99: Option<i64>,
    /// Largest; `None` when there are no sessions.
    pub max: Option<i64>,
}

/// The health report.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct HealthReport {
    /// The day (UTC) health was judged for.
    pub today: NaiveDate,
    /// Event partitions attached, pending detaches included.
    pub partitions: usize,
    /// Consecutive days after today with a partition.
    pub partitions_ahead: u32,
    /// The partition holding the earliest days; `None` without partitions.
    pub oldest_partition: Option<String>,
    /// The partition holding the latest days; `None` without partitions.
    pub newest_partition: Option<String>,
    /// Partitions an interrupted run left half-detached
    /// (`DETACH … CONCURRENTLY`); maintenance finishes them.
    pub pending_detaches: Vec<String>,
    /// Partition tables detached but never dropped.
    pub orphaned_partitions: Vec<String>,
    /// The last successful maintenance run; `None` before the first.
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
    /// Updates of `adk_sessions` since the statistics were last reset.
    pub session_updates: i64,
    /// How many of them were HOT (no index written).
    pub session_hot_updates: i64,
    /// HOT share of `adk_sessions` updates; `None` before any update.
    pub hot_ratio: Option<f64>,
    /// Sizes of session state.
    pub state_sizes: StateSizes,
    /// The usage rollups; `None` before migration 12.
    pub rollups: Option<RollupHealth>,
    /// The archive tier.
    pub archive: ArchiveHealth,
    /// On Citus, each node's shards and days ahead; empty on one server
    /// (and then left out of the JSON).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub nodes: Vec<NodeFacts>,
    /// Whether this report was read through a connection pooler (the
    /// session did not carry the mark its startup options set, see
    /// `adk_postgres_connect::DIRECT_SESSION_CHECK`): maintenance and the
    /// change feed need a direct connection.
    pub through_pooler: bool,
    /// Empty when healthy: each alert's line as `adk-pg status` prints it.
    pub alerts: Vec<String>,
    /// The same alerts, in the same order, typed. Left out of the JSON, so
    /// `adk-pg status --json` stays what it was.
    #[serde(skip)]
    pub typed_alerts: Vec<Alert>,
}

impl HealthReport {
    /// Whether there is no alert.
    pub fn is_healthy(&self) -> bool {
        self.alerts.is_empty()
    }

    /// The alerts about `area`.
    pub fn alerts_in(&self, area: AlertArea) -> impl Iterator<Item = &Alert> {
        self.typed_alerts.iter().filter(move |alert| alert.area == area)
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
        let mut rows: Vec<(&str, String)> = vec![
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
            (
                "connection",
                if self.through_pooler {
                    "through a connection pooler (maintenance and the change feed need a direct URL)".to_owned()
                } else {
                    "direct".to_owned()
                },
            ),
            ("sessions", sizes.sessions.to_string()),
            (
                "state size p50 / p90 / p99 / max",
                format!("{} / {} / {} / {}", bytes(sizes.p50), bytes(sizes.p90), bytes(sizes.p99), bytes(sizes.max)),
            ),
        ];
        for node in &self.nodes {
            rows.push((
                "Citus node",
                format!(
                    "{}: {} session shard(s), {} shard(s), {} B, {} day(s) ahead",
                    node.node, node.session_shards, node.shards, node.bytes, node.partitions_ahead
                ),
            ));
        }
        rows.push(("archive", self.archive.policy.clone()));
        if self.archive.objects > 0 || self.archive.on {
            rows.push((
                "archived",
                format!(
                    "{} app day(s), {} object(s), {} B{}",
                    self.archive.days,
                    self.archive.objects,
                    self.archive.bytes,
                    self.archive
                        .last_success
                        .map(|at| format!(", newest {}", at.format("%Y-%m-%d %H:%M:%S UTC")))
                        .unwrap_or_default()
                ),
            ));
        }
        match &self.rollups {
            Some(rollups) => rows.extend(rollups.rows()),
            None => rows.push(("usage rollups", "not installed (run adk-pg migrate)".into())),
        }
        rows.push(("status", if self.is_healthy() { "OK".into() } else { format!("{} alert(s)", self.alerts.len()) }));
        let mut table = comfy_table::Table::new();
        table.load_style(comfy_table::presets::UTF8_FULL_CONDENSED).set_header(["check", "value"]);
        for (check, value) in rows {
            table.add_row([check.to_owned(), value]);
        }
        write!(f, "{table}")
    }
}

impl RollupHealth {
    /// Its rows of the `adk-pg status` table.
    fn rows(&self) -> Vec<(&'static str, String)> {
        let at = |t: DateTime<Utc>| t.format("%Y-%m-%d %H:%M:%S UTC").to_string();
        let watermark = match (self.watermark, self.lag_secs) {
            (Some(watermark), Some(lag)) => {
                format!("{} ({} behind)", at(watermark), humantime::format_duration(Duration::from_secs(lag)))
            }
            (Some(watermark), None) => at(watermark),
            (None, _) => "never run".to_owned(),
        };
        let last_run = self.last_run.as_ref().map_or_else(
            || "never".to_owned(),
            |run| {
                let mut text = format!(
                    "{} {}: {} rolled up, {} late",
                    at(run.finished_at),
                    run.outcome,
                    run.events_rolled_up,
                    run.late_rejected
                );
                if let Some(error) = &run.error {
                    text.push_str(&format!(" ({error})"));
                }
                text
            },
        );
        let mut late = format!("{} / {}", self.late_rejected_today, self.late_rejected_yesterday);
        if !self.late_apps_today.is_empty() {
            let apps: Vec<String> = self.late_apps_today.iter().map(|a| format!("{} {}", a.app, a.rejected)).collect();
            late.push_str(&format!(" (today: {})", apps.join(", ")));
        }
        let tiers: Vec<String> = self
            .tiers
            .iter()
            .map(|tier| format!("{} {} B in {} partition(s)", tier.level, tier.bytes, tier.partitions))
            .collect();
        vec![
            ("rollup watermark", watermark),
            ("last rollup run", last_run),
            ("late events rejected today / yesterday", late),
            ("rollup sizes", tiers.join(", ")),
            ("rollup minute partitions ahead", self.minute_partitions_ahead.to_string()),
        ]
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

#[derive(QueryableByName)]
struct WatermarkRow {
    #[diesel(sql_type = Nullable<Timestamptz>)]
    watermark: Option<DateTime<Utc>>,
}

#[derive(QueryableByName)]
struct ExistsRow {
    #[diesel(sql_type = Bool)]
    exists: bool,
}

#[derive(QueryableByName)]
struct RollupRunRow {
    #[diesel(sql_type = Timestamptz)]
    finished_at: DateTime<Utc>,
    #[diesel(sql_type = Text)]
    outcome: String,
    #[diesel(sql_type = BigInt)]
    events_rolled: i64,
    #[diesel(sql_type = BigInt)]
    late_rejected: i64,
    #[diesel(sql_type = Nullable<Text>)]
    error: Option<String>,
}

#[derive(QueryableByName)]
struct LateDaysRow {
    #[diesel(sql_type = BigInt)]
    today: i64,
    #[diesel(sql_type = BigInt)]
    yesterday: i64,
}

#[derive(QueryableByName)]
struct LateAppRow {
    #[diesel(sql_type = Text)]
    app_name: String,
    #[diesel(sql_type = BigInt)]
    rejected: i64,
}

#[derive(QueryableByName)]
struct TierRow {
    #[diesel(sql_type = BigInt)]
    partitions: i64,
    #[diesel(sql_type = BigInt)]
    bytes: i64,
}

#[derive(QueryableByName)]
struct NameRow {
    #[diesel(sql_type = Text)]
    name: String,
}

/// The rollups' facts as of `now` (the server's clock) and `today`.
async fn rollup_health(
    conn: &mut AsyncPgConnection,
    schema: &str,
    today: NaiveDate,
    now: DateTime<Utc>,
    thresholds: &HealthThresholds,
) -> Result<RollupHealth, RetentionError> {
    let watermark = diesel::sql_query("SELECT watermark FROM adk_usage_state")
        .load::<WatermarkRow>(conn)
        .await
        .map_err(RetentionError::query("read the rollup watermark"))?
        .into_iter()
        .next()
        .and_then(|row| row.watermark);
    let lag_secs = watermark.map(|w| now.signed_duration_since(w).to_std().unwrap_or_default().as_secs());
    // Only before the first run. Stops at the first old row; partitions are
    // scanned oldest first and rows arrive in order, so an old one is found
    // at once when there is one, and without one there is little to scan.
    let overdue_events = match (watermark, TimeDelta::from_std(thresholds.max_rollup_lag).ok()) {
        (None, Some(lag)) => match now.checked_sub_signed(lag) {
            Some(cutoff) => {
                // An event arrives after its session was created, so one
                // that arrived before the cutoff sits in a partition of the
                // cutoff's day or earlier: premade days are never read.
                diesel::sql_query(
                    "SELECT EXISTS (SELECT 1 FROM adk_events WHERE created_at < $1 AND session_day <= $2) AS exists",
                )
                .bind::<Timestamptz, _>(cutoff)
                .bind::<Date, _>(cutoff.date_naive())
                .load::<ExistsRow>(conn)
                .await
                .and_then(first_row)
                .map_err(RetentionError::query("look for events waiting for the first rollup"))?
                .exists
            }
            None => false,
        },
        _ => false,
    };
    let last_run = diesel::sql_query(
        "SELECT finished_at, outcome, events_rolled, late_rejected, error FROM adk_usage_runs
         ORDER BY run_id DESC LIMIT 1",
    )
    .load::<RollupRunRow>(conn)
    .await
    .map_err(RetentionError::query("read the latest rollup run"))?
    .into_iter()
    .next()
    .map(|r| RollupRun {
        finished_at: r.finished_at,
        outcome: r.outcome,
        events_rolled_up: r.events_rolled,
        late_rejected: r.late_rejected,
        error: r.error,
    });
    let yesterday = today.checked_sub_days(Days::new(1)).unwrap_or(today);
    let late = diesel::sql_query(
        "SELECT coalesce(sum(rejected) FILTER (WHERE arrival_day = $1), 0)::bigint AS today,
                coalesce(sum(rejected) FILTER (WHERE arrival_day = $2), 0)::bigint AS yesterday
         FROM adk_usage_late_events WHERE arrival_day IN ($1, $2)",
    )
    .bind::<Date, _>(today)
    .bind::<Date, _>(yesterday)
    .load::<LateDaysRow>(conn)
    .await
    .and_then(first_row)
    .map_err(RetentionError::query("count late events"))?;
    let late_apps_today = diesel::sql_query(
        "SELECT app_name, rejected FROM adk_usage_late_events WHERE arrival_day = $1
         ORDER BY rejected DESC, app_name LIMIT 5",
    )
    .bind::<Date, _>(today)
    .load::<LateAppRow>(conn)
    .await
    .map_err(RetentionError::query("list apps with late events"))?
    .into_iter()
    .map(|row| LateApp { app: row.app_name, rejected: row.rejected })
    .collect();
    let qualified = |table: &str| format!("{}.{}", quote_ident(schema), quote_ident(table));
    let mut tiers = Vec::new();
    for (level, table) in [("1m", USAGE_MINUTES), ("1h", USAGE_HOURS), ("1d", USAGE_DAYS)] {
        let row = diesel::sql_query(
            "SELECT count(*) FILTER (WHERE t.isleaf AND t.level > 0) AS partitions,
                    coalesce(sum(pg_total_relation_size(t.relid)), 0)::bigint AS bytes
             FROM pg_partition_tree(to_regclass($1)) t",
        )
        .bind::<Text, _>(qualified(table))
        .load::<TierRow>(conn)
        .await
        .and_then(first_row)
        .map_err(RetentionError::query("measure the rollup tiers"))?;
        tiers.push(RollupTier { level: level.to_owned(), partitions: row.partitions, bytes: row.bytes });
    }
    let minute_prefix = format!("{USAGE_MINUTES}_p");
    let minute_days: BTreeSet<NaiveDate> = diesel::sql_query(
        "SELECT c.relname::text AS name FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
         WHERE i.inhparent = to_regclass($1)",
    )
    .bind::<Text, _>(qualified(USAGE_MINUTES))
    .load::<NameRow>(conn)
    .await
    .map_err(RetentionError::query("list the minute rollup partitions"))?
    .into_iter()
    .filter_map(|row| {
        let day = row.name.strip_prefix(&minute_prefix)?;
        NaiveDate::parse_from_str(day, "%Y%m%d").ok()
    })
    .collect();
    let minute_partitions_ahead =
        today.iter_days().skip(1).take_while(|day| minute_days.contains(day)).count().try_into().unwrap_or(u32::MAX);
    Ok(RollupHealth {
        watermark,
        lag_secs,
        overdue_events,
        last_run,
        late_rejected_today: late.today,
        late_rejected_yesterday: late.yesterday,
        late_apps_today,
        tiers,
        minute_partitions_ahead,
    })
}

/// The alerts the rollups' facts raise.
fn rollup_alerts(rollups: &RollupHealth, thresholds: &HealthThresholds, today: NaiveDate) -> Vec<Alert> {
    let mut alerts = Vec::new();
    let lag_limit = humantime::format_duration(thresholds.max_rollup_lag);
    match rollups.lag_secs {
        None if rollups.overdue_events => alerts.push(Alert::warning(
            Check::RollupsNeverRun,
            format!(
                "rollups have never run, and events arrived more than {lag_limit} ago; \
                 run adk-pg rollup (e.g. --every 1m)"
            ),
        )),
        Some(lag) if lag > thresholds.max_rollup_lag.as_secs() => alerts.push(Alert::warning(
            Check::RollupLag,
            format!(
                "rollups are {} behind (want at most {lag_limit}); is adk-pg rollup running?",
                humantime::format_duration(Duration::from_secs(lag))
            ),
        )),
        _ => {}
    }
    if let Some(run) = &rollups.last_run {
        let at = run.finished_at.format("%Y-%m-%d %H:%M:%S UTC");
        let error = run.error.as_deref().unwrap_or("no error recorded");
        match run.outcome.as_str() {
            "failed" => alerts
                .push(Alert::warning(Check::RollupRunFailed, format!("the last rollup run failed at {at}: {error}"))),
            "waiting" => alerts.push(Alert::warning(
                Check::RollupRunWaiting,
                format!("the last rollup run could not advance at {at}: {error}"),
            )),
            _ => {}
        }
    }
    if u64::try_from(rollups.late_rejected_today).unwrap_or_default() > thresholds.max_late_rejected_today {
        let apps: Vec<String> = rollups.late_apps_today.iter().map(|a| format!("{} ({})", a.app, a.rejected)).collect();
        alerts.push(Alert::warning(
            Check::LateEvents,
            format!(
                "{} event(s) arriving on {today} were rejected as late and are not in the usage figures \
                 (apps: {}); check those clients' clocks or raise usage_lateness",
                rollups.late_rejected_today,
                apps.join(", ")
            ),
        ));
    }
    alerts
}

#[derive(diesel::QueryableByName)]
struct DirectRow {
    #[diesel(sql_type = Bool)]
    direct: bool,
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

/// [`health`] on a connection already open.
pub async fn health_on(
    conn: &mut AsyncPgConnection,
    today: NaiveDate,
    thresholds: &HealthThresholds,
) -> Result<HealthReport, RetentionError> {
    let through_pooler = !diesel::sql_query(adk_postgres_connect::DIRECT_SESSION_CHECK)
        .load::<DirectRow>(conn)
        .await
        .map_err(RetentionError::query("check for a connection pooler"))?
        .iter()
        .any(|row| row.direct);
    let schema = events_schema(conn).await?;
    let partitions = list_partitions(conn).await?;
    let orphaned_partitions = list_orphans(conn, &schema).await?;
    let policy = store_policy(conn).await?;
    let usage = usage_policy(conn).await?;
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
        alerts.push(Alert::critical(
            Check::TodayPartition,
            format!("no partition for today ({today}): appends to new sessions fail"),
        ));
    }
    if partitions_ahead < thresholds.min_partitions_ahead {
        let message = format!(
            "only {partitions_ahead} future day(s) have a partition (want at least {}); run adk-pg maintain",
            thresholds.min_partitions_ahead
        );
        // With none ahead, the first appends after midnight depend on the
        // store making the day's partition itself, under exclusive locks.
        alerts.push(if partitions_ahead == 0 {
            Alert::critical(Check::PartitionsAhead, message)
        } else {
            Alert::warning(Check::PartitionsAhead, message)
        });
    }
    match &last_run {
        None => alerts.push(Alert::warning(Check::MaintenanceNeverRun, "maintenance has never run")),
        Some(run) => {
            let age = now.signed_duration_since(run.finished_at).to_std().unwrap_or_default();
            if age > thresholds.max_run_age {
                alerts.push(Alert::warning(
                    Check::MaintenanceStale,
                    format!("the last maintenance run finished {}s ago", age.as_secs()),
                ));
            }
        }
    }
    if let Some(failure) = &last_failure {
        alerts.push(Alert::warning(
            Check::MaintenanceFailed,
            format!(
                "the last maintenance run (for {}) failed at {}: {}",
                failure.today,
                failure.finished_at.format("%Y-%m-%d %H:%M:%S UTC"),
                failure.error
            ),
        ));
    }
    for overdue in &overdue_partitions {
        alerts.push(Alert::warning(
            Check::OverduePartition,
            match overdue.last_active {
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
            },
        ));
    }
    let pending_detaches: Vec<String> =
        partitions.iter().filter(|p| p.detach_pending).map(|p| p.name.clone()).collect();
    if !pending_detaches.is_empty() {
        alerts.push(Alert::warning(
            Check::PendingDetach,
            format!("detaches left pending by an interrupted run: {}", pending_detaches.join(", ")),
        ));
    }
    let nodes = if on_citus(conn).await? { nodes::node_facts(conn, &live, today).await? } else { Vec::new() };
    // The coordinator holds no event shards; a worker that holds users'
    // sessions but not the coming days' partitions refuses their appends.
    for node in nodes.iter().filter(|node| node.session_shards > 0) {
        if node.partitions_ahead < thresholds.min_partitions_ahead {
            alerts.push(Alert::warning(
                Check::NodePartitionsAhead,
                format!(
                    "Citus node {} has partitions for only {} future day(s) (want at least {}); run adk-pg maintain",
                    node.node, node.partitions_ahead, thresholds.min_partitions_ahead
                ),
            ));
        }
    }
    let rollups = match usage {
        Some(_) => Some(rollup_health(conn, &schema, today, now, thresholds).await?),
        None => None,
    };
    if let Some(rollups) = &rollups {
        alerts.extend(rollup_alerts(rollups, thresholds, today));
    }
    let archive = archive_health(conn).await?;
    for pending in &archive.pending {
        alerts.push(Alert::warning(
            Check::ArchiveFailed,
            format!(
                "the archive of app {} for {} failed ({}), so the day is kept: {}; maintenance tries again on its \
                 next run",
                pending.app_name,
                pending.day,
                pending.failed_at.format("%Y-%m-%d %H:%M:%S UTC"),
                pending.error
            ),
        ));
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
        policy: PolicySummary::of(&policy).with_usage(usage.as_ref()),
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
        rollups,
        archive,
        nodes,
        through_pooler,
        alerts: alerts.iter().map(ToString::to_string).collect(),
        typed_alerts: alerts,
    })
}

/// The archive's facts: the policy, the catalog's totals, and the app days
/// whose archive failed and which are still kept (an open failure whose
/// day was archived since is resolved by that run).
async fn archive_health(conn: &mut AsyncPgConnection) -> Result<ArchiveHealth, RetentionError> {
    #[derive(QueryableByName)]
    struct Totals {
        #[diesel(sql_type = BigInt)]
        objects: i64,
        #[diesel(sql_type = BigInt)]
        bytes: i64,
        #[diesel(sql_type = BigInt)]
        days: i64,
        #[diesel(sql_type = Nullable<Timestamptz>)]
        last_success: Option<DateTime<Utc>>,
        #[diesel(sql_type = BigInt)]
        failures: i64,
    }
    let policy = adk_postgres_archive::read_archive_policy(conn)
        .await
        .map_err(|e| RetentionError::Conflict(format!("read the archive policy: {e}")))?;
    let totals = diesel::sql_query(
        "SELECT count(*) AS objects, coalesce(sum(bytes), 0)::bigint AS bytes,
                count(DISTINCT (app_name, day)) AS days, max(verified_at) AS last_success,
                (SELECT count(*) FROM adk_archive_failures) AS failures
           FROM adk_archive_objects",
    )
    .load::<Totals>(conn)
    .await
    .and_then(first_row)
    .map_err(RetentionError::query("read the archive catalog"))?;
    let pending = diesel::sql_query(
        "SELECT DISTINCT ON (app_name, day) app_name, day, failed_at, error
           FROM adk_archive_failures WHERE resolved_at IS NULL
          ORDER BY app_name, day, failed_at DESC",
    )
    .load::<PendingArchive>(conn)
    .await
    .map_err(RetentionError::query("read the archive failures"))?;
    Ok(ArchiveHealth {
        policy: policy.to_string(),
        on: policy.is_on(),
        objects: totals.objects,
        bytes: totals.bytes,
        days: totals.days,
        last_success: totals.last_success,
        pending,
        failures: totals.failures,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn quiet() -> RollupHealth {
        RollupHealth {
            watermark: None,
            lag_secs: None,
            overdue_events: false,
            last_run: None,
            late_rejected_today: 0,
            late_rejected_yesterday: 0,
            late_apps_today: Vec::new(),
            tiers: Vec::new(),
            minute_partitions_ahead: 8,
        }
    }

    fn today() -> NaiveDate {
        NaiveDate::from_ymd_opt(2030, 3, 1).unwrap_or_default()
    }

    fn alerts(rollups: &RollupHealth) -> Vec<String> {
        rollup_alerts(rollups, &HealthThresholds::default(), today()).iter().map(ToString::to_string).collect()
    }

    fn checks(rollups: &RollupHealth) -> Vec<Check> {
        rollup_alerts(rollups, &HealthThresholds::default(), today()).iter().map(|alert| alert.check).collect()
    }

    #[test]
    fn a_store_without_events_or_runs_does_not_alert() {
        assert_eq!(alerts(&quiet()), Vec::<String>::new());
        let fresh = RollupHealth { watermark: Some(DateTime::UNIX_EPOCH), lag_secs: Some(60), ..quiet() };
        assert_eq!(alerts(&fresh), Vec::<String>::new());
    }

    #[test]
    fn never_running_alerts_only_once_events_are_overdue() {
        let overdue = alerts(&RollupHealth { overdue_events: true, ..quiet() });
        assert_eq!(overdue.len(), 1);
        assert!(overdue[0].contains("rollups have never run"), "{overdue:?}");
        assert_eq!(checks(&RollupHealth { overdue_events: true, ..quiet() }), vec![Check::RollupsNeverRun]);
    }

    #[test]
    fn lag_alerts_above_the_threshold_only() {
        assert!(alerts(&RollupHealth { lag_secs: Some(15 * 60), ..quiet() }).is_empty());
        let behind = alerts(&RollupHealth { lag_secs: Some(15 * 60 + 1), ..quiet() });
        assert!(behind.iter().any(|a| a.contains("rollups are 15m 1s behind")), "{behind:?}");
        assert_eq!(checks(&RollupHealth { lag_secs: Some(15 * 60 + 1), ..quiet() }), vec![Check::RollupLag]);
    }

    #[test]
    fn a_failed_or_waiting_last_run_alerts_and_an_ok_one_does_not() {
        let run = |outcome: &str, error: Option<&str>| RollupHealth {
            lag_secs: Some(1),
            last_run: Some(RollupRun {
                finished_at: DateTime::UNIX_EPOCH,
                outcome: outcome.to_owned(),
                events_rolled_up: 0,
                late_rejected: 0,
                error: error.map(str::to_owned),
            }),
            ..quiet()
        };
        let failed = alerts(&run("failed", Some("boom")));
        assert!(failed.iter().any(|a| a.contains("last rollup run failed") && a.contains("boom")), "{failed:?}");
        let waiting = alerts(&run("waiting", Some("writers still running: 3/7")));
        assert!(waiting.iter().any(|a| a.contains("could not advance") && a.contains("3/7")), "{waiting:?}");
        assert!(alerts(&run("ok", None)).is_empty());
        assert_eq!(checks(&run("failed", Some("boom"))), vec![Check::RollupRunFailed]);
        assert_eq!(checks(&run("waiting", None)), vec![Check::RollupRunWaiting]);
        let areas: Vec<AlertArea> = rollup_alerts(&run("failed", None), &HealthThresholds::default(), today())
            .iter()
            .map(|alert| alert.area)
            .collect();
        assert_eq!(areas, vec![AlertArea::Rollups]);
    }

    #[test]
    fn late_rejections_of_today_alert_and_yesterdays_do_not() {
        assert!(alerts(&RollupHealth { late_rejected_yesterday: 9, ..quiet() }).is_empty());
        let late = alerts(&RollupHealth {
            late_rejected_today: 3,
            late_apps_today: vec![LateApp { app: "shop".into(), rejected: 3 }],
            ..quiet()
        });
        assert!(late.iter().any(|a| a.contains("3 event(s) arriving on 2030-03-01") && a.contains("shop (3)")));
        assert_eq!(checks(&RollupHealth { late_rejected_today: 1, ..quiet() }), vec![Check::LateEvents]);
        let tolerant = HealthThresholds { max_late_rejected_today: 3, ..HealthThresholds::default() };
        assert!(rollup_alerts(&RollupHealth { late_rejected_today: 3, ..quiet() }, &tolerant, today()).is_empty());
    }
}
