//! What the server reads, section by section. Each section is read on its
//! own and fails on its own: a timeout in one leaves the others' figures.
//!
//! Every statement is bounded: usage and the app list by the window on the
//! rollups' partition key (`bucket_start`), late events by their arrival
//! day, run history by a row limit on the primary key, state sizes by a
//! sample cap; and all of them by the connection's statement timeout.

use adk_postgres_retention::health::health_on;
use adk_postgres_retention::partitions::{Partition, list_partitions};
use adk_postgres_retention::{HealthReport, HealthThresholds, usage_installed};
use adk_postgres_rollup::{GroupBy, UsageQuery, UsageReport, usage};
use chrono::{DateTime, NaiveDate, Utc};
use diesel::QueryableByName;
use diesel::sql_types::{BigInt, Date, Integer, Nullable, Text, Timestamptz};
use diesel_async::{AsyncPgConnection, RunQueryDsl};
use serde::Serialize;

use crate::db::migration_status;
use crate::error::SectionError;
use crate::view::DashboardQuery;

/// A section's figures, or why it has none.
pub type Section<T> = Result<T, SectionError>;

/// Rows of run history shown per kind of run.
pub const HISTORY_ROWS: i64 = 12;
/// Most apps listed in the picker.
pub const MAX_APPS: i64 = 50;
/// Rows sampled for state-size percentiles, as `adk-pg status` does, so a
/// scrape stays cheap on a table of millions.
pub const SIZE_SAMPLE: i64 = 100_000;

/// Whether the schema has its migrations.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct MigrationStatus {
    /// Migrations compiled into this binary.
    pub compiled: usize,
    /// Their versions the database has not applied.
    pub pending: Vec<String>,
}

/// Sessions by what they can still do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct SessionCounts {
    /// Open and not expired: they take appends.
    pub live: i64,
    /// Past `expires_at` and not purged yet (`adk-pg expire` deletes them).
    pub expired: i64,
    /// Closed by a rollover and not expired.
    pub closed: i64,
}

/// `pg_column_size(state)` of one state scope, in bytes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, QueryableByName)]
pub struct ScopeSizes {
    /// `session`, `user` or `app`.
    #[diesel(sql_type = Text)]
    pub scope: String,
    /// Rows measured: at most the first 100,000 read.
    #[diesel(sql_type = BigInt)]
    pub rows: i64,
    /// Median size; `None` when there are no rows.
    #[diesel(sql_type = Nullable<BigInt>)]
    pub p50: Option<i64>,
    /// 90th percentile; `None` when there are no rows.
    #[diesel(sql_type = Nullable<BigInt>)]
    pub p90: Option<i64>,
    /// 99th percentile; `None` when there are no rows.
    #[diesel(sql_type = Nullable<BigInt>)]
    pub p99: Option<i64>,
    /// Largest; `None` when there are no rows.
    #[diesel(sql_type = Nullable<BigInt>)]
    pub max: Option<i64>,
}

/// Late rejections of one app, for today's arrivals.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, QueryableByName)]
pub struct LateToday {
    /// The app.
    #[diesel(sql_type = Text)]
    pub app: String,
    /// Its events arriving today that were rejected as late.
    #[diesel(sql_type = BigInt)]
    pub rejected: i64,
}

/// What the metrics and the health cards are made of.
#[derive(Debug, Clone)]
pub struct OpsSnapshot {
    /// The database's clock (the process's when it could not be read).
    pub now: DateTime<Utc>,
    /// `now`'s UTC day: the day health judges by.
    pub today: NaiveDate,
    /// Set when no connection could be opened; every section then carries
    /// the same error.
    pub unreachable: Option<SectionError>,
    /// What `adk-pg status` reports, alerts included.
    pub health: Section<HealthReport>,
    /// The event partitions attached, oldest first.
    pub partitions: Section<Vec<Partition>>,
    /// Sessions by what they can still do.
    pub sessions: Section<SessionCounts>,
    /// State sizes of each scope.
    pub state_sizes: Section<Vec<ScopeSizes>>,
    /// Every app with late rejections among today's arrivals; empty before
    /// the usage rollups are installed.
    pub late_today: Section<Vec<LateToday>>,
    /// When the last successful rollup run finished; `None` before one.
    pub last_rollup_ok: Section<Option<DateTime<Utc>>>,
    /// Whether the schema has its migrations.
    pub migrations: Section<MigrationStatus>,
    /// The thresholds health was judged by.
    pub thresholds: HealthThresholds,
}

/// One maintenance run, newest first.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, QueryableByName)]
pub struct MaintenanceRun {
    /// The run's number in `adk_maintenance_runs`.
    #[diesel(sql_type = BigInt)]
    pub run_id: i64,
    /// When it started.
    #[diesel(sql_type = Timestamptz)]
    pub started_at: DateTime<Utc>,
    /// When it ended.
    #[diesel(sql_type = Timestamptz)]
    pub finished_at: DateTime<Utc>,
    /// The day (UTC) it worked for.
    #[diesel(sql_type = Date)]
    pub today: NaiveDate,
    /// `ok` or `failed`.
    #[diesel(sql_type = Text)]
    pub outcome: String,
    /// Why it failed; `None` unless it did.
    #[diesel(sql_type = Nullable<Text>)]
    pub error: Option<String>,
    /// Partitions it created.
    #[diesel(sql_type = Integer)]
    pub created: i32,
    /// Partitions it dropped.
    #[diesel(sql_type = Integer)]
    pub dropped: i32,
    /// Session rows of dropped days it deleted.
    #[diesel(sql_type = BigInt)]
    pub sessions_deleted: i64,
    /// Consecutive days after `today` with a partition, after the run.
    #[diesel(sql_type = Integer)]
    pub partitions_ahead: i32,
}

/// One rollup run, newest first.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, QueryableByName)]
pub struct RollupRun {
    /// The run's number in `adk_usage_runs`.
    #[diesel(sql_type = BigInt)]
    pub run_id: i64,
    /// When it started.
    #[diesel(sql_type = Timestamptz)]
    pub started_at: DateTime<Utc>,
    /// When it ended.
    #[diesel(sql_type = Timestamptz)]
    pub finished_at: DateTime<Utc>,
    /// `ok`, `failed` or `waiting` (writers outlived its wait; it did not
    /// advance).
    #[diesel(sql_type = Text)]
    pub outcome: String,
    /// Why it failed; `None` unless it did.
    #[diesel(sql_type = Nullable<Text>)]
    pub error: Option<String>,
    /// Events that arrived in its window.
    #[diesel(sql_type = BigInt)]
    pub events_read: i64,
    /// Of those, events merged into minute rows.
    #[diesel(sql_type = BigInt)]
    pub events_rolled: i64,
    /// Events counted as late instead.
    #[diesel(sql_type = BigInt)]
    pub late_rejected: i64,
    /// Minute buckets it wrote.
    #[diesel(sql_type = Integer)]
    pub minute_buckets: i32,
}

/// The latest runs of maintenance and of the rollups.
#[derive(Debug, Clone)]
pub struct History {
    /// The latest maintenance runs, newest first.
    pub maintenance: Section<Vec<MaintenanceRun>>,
    /// The latest rollup runs, newest first.
    pub rollups: Section<Vec<RollupRun>>,
}

/// An app's traffic in the window, for the picker.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, QueryableByName)]
pub struct AppTotal {
    /// The app.
    #[diesel(sql_type = Text)]
    pub app: String,
    /// Its events on the window's days (whole UTC days).
    #[diesel(sql_type = BigInt)]
    pub events: i64,
    /// Its total tokens on those days.
    #[diesel(sql_type = BigInt)]
    pub tokens: i64,
}

/// The usage section: the apps of the window and the chosen app's figures.
#[derive(Debug, Clone)]
pub struct UsageView {
    /// The window's start.
    pub since: DateTime<Utc>,
    /// The window's end (exclusive).
    pub until: DateTime<Utc>,
    /// Apps with rollups in the window, busiest first.
    pub apps: Section<Vec<AppTotal>>,
    /// The app shown: the one asked for, else the busiest.
    pub app: Option<String>,
    /// The app as a whole; `None` when there is no app to show.
    pub overall: Option<Section<UsageReport>>,
    /// One series per agent (author).
    pub by_agent: Option<Section<UsageReport>>,
}

#[derive(QueryableByName)]
struct NowRow {
    #[diesel(sql_type = Timestamptz)]
    now: DateTime<Utc>,
}

#[derive(QueryableByName)]
struct SessionsRow {
    #[diesel(sql_type = BigInt)]
    live: i64,
    #[diesel(sql_type = BigInt)]
    expired: i64,
    #[diesel(sql_type = BigInt)]
    closed: i64,
}

#[derive(QueryableByName)]
struct FinishedRow {
    #[diesel(sql_type = Timestamptz)]
    finished_at: DateTime<Utc>,
}

fn section(context: &'static str) -> impl FnOnce(diesel::result::Error) -> SectionError {
    move |e| SectionError::new(context, &e)
}

impl OpsSnapshot {
    /// The snapshot when no connection could be opened.
    pub(crate) fn unreachable(error: SectionError, thresholds: &HealthThresholds) -> Self {
        let now = Utc::now();
        Self {
            now,
            today: now.date_naive(),
            unreachable: Some(error.clone()),
            health: Err(error.clone()),
            partitions: Err(error.clone()),
            sessions: Err(error.clone()),
            state_sizes: Err(error.clone()),
            late_today: Err(error.clone()),
            last_rollup_ok: Err(error.clone()),
            migrations: Err(error),
            thresholds: thresholds.clone(),
        }
    }

    /// Every section error, named by section, for the scrape-error metric.
    pub fn section_errors(&self) -> Vec<(&'static str, &SectionError)> {
        if let Some(error) = &self.unreachable {
            return vec![("connect", error)];
        }
        [
            ("health", self.health.as_ref().err()),
            ("partitions", self.partitions.as_ref().err()),
            ("sessions", self.sessions.as_ref().err()),
            ("state_sizes", self.state_sizes.as_ref().err()),
            ("late_events", self.late_today.as_ref().err()),
            ("rollup_runs", self.last_rollup_ok.as_ref().err()),
            ("migrations", self.migrations.as_ref().err()),
        ]
        .into_iter()
        .filter_map(|(name, error)| error.map(|error| (name, error)))
        .collect()
    }
}

/// The database's clock; the process's when the database cannot say.
pub(crate) async fn clock(conn: &mut AsyncPgConnection) -> Section<DateTime<Utc>> {
    diesel::sql_query("SELECT now() AS now")
        .load::<NowRow>(conn)
        .await
        .map_err(section("read the database clock"))?
        .into_iter()
        .next()
        .map(|row| row.now)
        .ok_or_else(|| SectionError::new("read the database clock", &"no row"))
}

/// Reads every operations fact, one section at a time.
pub(crate) async fn ops(conn: &mut AsyncPgConnection, thresholds: &HealthThresholds) -> OpsSnapshot {
    let now = match clock(conn).await {
        Ok(now) => now,
        // A connection that cannot even read the clock is as good as none.
        Err(error) => return OpsSnapshot::unreachable(error, thresholds),
    };
    let today = now.date_naive();
    let health = health_on(conn, today, thresholds).await.map_err(|e| SectionError::new("read health", &e));
    let partitions = list_partitions(conn).await.map_err(|e| SectionError::new("list the event partitions", &e));
    let sessions = session_counts(conn, now).await;
    let state_sizes = state_sizes(conn).await;
    let installed = usage_installed(conn).await.map_err(|e| SectionError::new("look for the usage rollups", &e));
    let (late_today, last_rollup_ok) = match installed {
        Ok(true) => (late_today(conn, today).await, last_rollup_ok(conn).await),
        Ok(false) => (Ok(Vec::new()), Ok(None)),
        Err(error) => (Err(error.clone()), Err(error)),
    };
    let migrations = migration_status(conn).await;
    OpsSnapshot {
        now,
        today,
        unreachable: None,
        health,
        partitions,
        sessions,
        state_sizes,
        late_today,
        last_rollup_ok,
        migrations,
        thresholds: thresholds.clone(),
    }
}

async fn session_counts(conn: &mut AsyncPgConnection, now: DateTime<Utc>) -> Section<SessionCounts> {
    // The clock is bound, not `now()` in the statement, so the counts agree
    // with the snapshot's time.
    let row = diesel::sql_query(
        "SELECT count(*) FILTER (WHERE closed_at IS NULL AND (expires_at IS NULL OR expires_at > $1)) AS live,
                count(*) FILTER (WHERE expires_at <= $1) AS expired,
                count(*) FILTER (WHERE closed_at IS NOT NULL AND (expires_at IS NULL OR expires_at > $1)) AS closed
         FROM adk_sessions",
    )
    .bind::<Timestamptz, _>(now)
    .load::<SessionsRow>(conn)
    .await
    .map_err(section("count sessions"))?
    .into_iter()
    .next()
    .ok_or_else(|| SectionError::new("count sessions", &"no row"))?;
    Ok(SessionCounts { live: row.live, expired: row.expired, closed: row.closed })
}

async fn state_sizes(conn: &mut AsyncPgConnection) -> Section<Vec<ScopeSizes>> {
    let scope = |scope: &str, table: &str| {
        format!(
            "SELECT '{scope}'::text AS scope, count(*) AS rows,
                    percentile_disc(0.5) WITHIN GROUP (ORDER BY size)::bigint AS p50,
                    percentile_disc(0.9) WITHIN GROUP (ORDER BY size)::bigint AS p90,
                    percentile_disc(0.99) WITHIN GROUP (ORDER BY size)::bigint AS p99,
                    max(size)::bigint AS max
             FROM (SELECT pg_column_size(state)::bigint AS size FROM {table} LIMIT $1) s"
        )
    };
    let sql = [scope("session", "adk_sessions"), scope("user", "adk_user_states"), scope("app", "adk_app_states")]
        .join(" UNION ALL ");
    diesel::sql_query(sql)
        .bind::<BigInt, _>(SIZE_SAMPLE)
        .load::<ScopeSizes>(conn)
        .await
        .map_err(section("measure state sizes"))
}

async fn late_today(conn: &mut AsyncPgConnection, today: NaiveDate) -> Section<Vec<LateToday>> {
    diesel::sql_query(
        "SELECT app_name AS app, rejected FROM adk_usage_late_events WHERE arrival_day = $1
         ORDER BY rejected DESC, app_name LIMIT 1000",
    )
    .bind::<Date, _>(today)
    .load::<LateToday>(conn)
    .await
    .map_err(section("count late events"))
}

async fn last_rollup_ok(conn: &mut AsyncPgConnection) -> Section<Option<DateTime<Utc>>> {
    Ok(diesel::sql_query("SELECT finished_at FROM adk_usage_runs WHERE outcome = 'ok' ORDER BY run_id DESC LIMIT 1")
        .load::<FinishedRow>(conn)
        .await
        .map_err(section("read the last successful rollup run"))?
        .into_iter()
        .next()
        .map(|row| row.finished_at))
}

/// The latest maintenance and rollup runs.
pub(crate) async fn history(conn: &mut AsyncPgConnection) -> History {
    let maintenance = diesel::sql_query(
        "SELECT run_id, started_at, finished_at, today, outcome, error, created, dropped, sessions_deleted,
                partitions_ahead
         FROM adk_maintenance_runs ORDER BY run_id DESC LIMIT $1",
    )
    .bind::<BigInt, _>(HISTORY_ROWS)
    .load::<MaintenanceRun>(conn)
    .await
    .map_err(section("read the maintenance runs"));
    let rollups = match usage_installed(conn).await {
        Ok(true) => diesel::sql_query(
            "SELECT run_id, started_at, finished_at, outcome, error, events_read, events_rolled, late_rejected,
                    minute_buckets
             FROM adk_usage_runs ORDER BY run_id DESC LIMIT $1",
        )
        .bind::<BigInt, _>(HISTORY_ROWS)
        .load::<RollupRun>(conn)
        .await
        .map_err(section("read the rollup runs")),
        Ok(false) => Ok(Vec::new()),
        Err(e) => Err(SectionError::new("look for the usage rollups", &e)),
    };
    History { maintenance, rollups }
}

/// The usage section for `query` as of `now`.
pub(crate) async fn usage_view(conn: &mut AsyncPgConnection, query: &DashboardQuery, now: DateTime<Utc>) -> UsageView {
    let until = now;
    let since = now - query.window.span();
    let mut view = UsageView { since, until, apps: Ok(Vec::new()), app: None, overall: None, by_agent: None };
    match usage_installed(conn).await {
        Ok(true) => {}
        Ok(false) => {
            view.apps = Err(SectionError::new(
                "read usage",
                &"the usage rollups are not installed; run adk-pg migrate, then adk-pg rollup",
            ));
            return view;
        }
        Err(e) => {
            view.apps = Err(SectionError::new("look for the usage rollups", &e));
            return view;
        }
    }
    view.apps = apps_in(conn, since, until).await;
    view.app = query
        .app
        .clone()
        .or_else(|| view.apps.as_ref().ok().and_then(|apps| <[_]>::first(apps)).map(|a| a.app.clone()));
    let Some(app) = view.app.clone() else { return view };
    let ask = |by: Option<GroupBy>| UsageQuery {
        app: app.clone(),
        window: Some((since, until)),
        by,
        resolution: query.resolution.resolution(),
    };
    view.overall = Some(usage(conn, &ask(None)).await.map_err(|e| SectionError::new("read usage", &e)));
    view.by_agent =
        Some(usage(conn, &ask(Some(GroupBy::Agent))).await.map_err(|e| SectionError::new("read usage by agent", &e)));
    view
}

/// Apps with day rollups in the window, busiest first. Day rows are few
/// (per app, author and kind) and their partitions are years, so this
/// reads one or two small partitions whatever the window.
async fn apps_in(conn: &mut AsyncPgConnection, since: DateTime<Utc>, until: DateTime<Utc>) -> Section<Vec<AppTotal>> {
    let day_start = since.date_naive().and_hms_opt(0, 0, 0).map(|t| t.and_utc()).unwrap_or(since);
    // A day bucket that started before `since` still holds the window's
    // first hours, hence the floor; the upper end needs none.
    diesel::sql_query(
        "SELECT app_name AS app, sum(events)::bigint AS events, sum(total_tokens)::bigint AS tokens
         FROM adk_usage_1d WHERE bucket_start >= $1 AND bucket_start < $2
         GROUP BY app_name ORDER BY events DESC, app_name LIMIT $3",
    )
    .bind::<Timestamptz, _>(day_start)
    .bind::<Timestamptz, _>(until)
    .bind::<BigInt, _>(MAX_APPS)
    .load::<AppTotal>(conn)
    .await
    .map_err(section("list the apps with usage"))
}
