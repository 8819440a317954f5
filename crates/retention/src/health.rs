//! Health: what an operator (or an alert rule) needs to know about the
//! store at a glance.

use std::time::Duration;

use chrono::{DateTime, NaiveDate, Utc};
use diesel::QueryableByName;
use diesel::sql_types::{BigInt, Date, Integer, Nullable, Timestamptz};
use diesel_async::{AsyncPgConnection, RunQueryDsl};
use serde::Serialize;

use crate::error::OpsError;
use crate::partitions::{days_ahead, list_orphans, list_partitions};
use crate::sql::{LockPolicy, connect, events_schema};

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
) -> Result<HealthReport, OpsError> {
    let mut conn = connect(database_url, "adk-pg status", &LockPolicy::default()).await?;
    health_on(&mut conn, today, thresholds).await
}

pub async fn health_on(
    conn: &mut AsyncPgConnection,
    today: NaiveDate,
    thresholds: &HealthThresholds,
) -> Result<HealthReport, OpsError> {
    let schema = events_schema(conn).await?;
    let partitions = list_partitions(conn).await?;
    let orphaned_partitions = list_orphans(conn, &schema).await?;
    let last_run = diesel::sql_query(
        "SELECT finished_at, today, created, dropped, sessions_deleted FROM adk_maintenance_runs
         ORDER BY run_id DESC LIMIT 1",
    )
    .load::<RunRow>(conn)
    .await
    .map_err(OpsError::query("read the last maintenance run"))?
    .into_iter()
    .next()
    .map(|r| LastRun {
        finished_at: r.finished_at,
        today: r.today,
        created: r.created,
        dropped: r.dropped,
        sessions_deleted: r.sessions_deleted,
    });
    let updates = diesel::sql_query(
        "SELECT coalesce(sum(n_tup_upd), 0)::bigint AS updates, coalesce(sum(n_tup_hot_upd), 0)::bigint AS hot
         FROM pg_stat_user_tables WHERE relid = to_regclass('adk_sessions')",
    )
    .get_result::<UpdatesRow>(conn)
    .await
    .map_err(OpsError::query("read update statistics"))?;
    // Bounded, so a status call stays cheap on a table of millions of sessions.
    let sizes = diesel::sql_query(
        "SELECT count(*) AS sessions,
                percentile_disc(0.5) WITHIN GROUP (ORDER BY size)::bigint AS p50,
                percentile_disc(0.9) WITHIN GROUP (ORDER BY size)::bigint AS p90,
                percentile_disc(0.99) WITHIN GROUP (ORDER BY size)::bigint AS p99,
                max(size)::bigint AS max
         FROM (SELECT pg_column_size(state) AS size FROM adk_sessions LIMIT 100000) s",
    )
    .get_result::<SizesRow>(conn)
    .await
    .map_err(OpsError::query("measure state sizes"))?;
    let now = diesel::sql_query("SELECT now() AS now")
        .get_result::<NowRow>(conn)
        .await
        .map_err(OpsError::query("read the clock"))?
        .now;

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
