//! Usage queries: always over a time window, answered from the coarsest
//! rollup level that satisfies the resolution, never from raw events.
//!
//! Routing: the resolution is the width of one point of the answer. The
//! level read is the coarsest whose bucket width divides it (a day of 1 h
//! rows for `1d` points, 1 m rows for `5m` points) among the levels whose
//! tier still holds the window's start. `auto` picks the finest of
//! [`AUTO_STEPS`] giving at most [`AUTO_POINTS`] points. A window asking
//! for more than [`MAX_POINTS`] points is refused, as is a query without a
//! window. The SQL filters on the raw partition column (`bucket_start`)
//! with bound values, so only the window's partitions are read.

use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;

use adk_postgres_schema::quote::quote_ident;
use bigdecimal::BigDecimal;
use chrono::{DateTime, Duration, TimeZone, Utc};
use diesel::QueryableByName;
use diesel::sql_types::{BigInt, Nullable, Text, Timestamptz};
use diesel_async::{AsyncPgConnection, RunQueryDsl};
use serde::Serialize;

use crate::bucket::{Aggregate, Level};
use crate::error::UsageError;
use crate::rows::{LevelRow, ROW_COLUMNS};

/// Most points one answer may hold (per series).
pub const MAX_POINTS: i64 = 2_000;
/// How many points `auto` aims for at most: a chart's width.
pub const AUTO_POINTS: i64 = 400;
/// The resolutions `auto` chooses from.
pub const AUTO_STEPS: [Duration; 8] = [
    Duration::minutes(1),
    Duration::minutes(5),
    Duration::minutes(15),
    Duration::hours(1),
    Duration::hours(6),
    Duration::days(1),
    Duration::days(7),
    Duration::days(30),
];
/// Longest a usage query may run on the server.
pub const STATEMENT_TIMEOUT_MS: u64 = 30_000;

/// The width of one point of the answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Resolution {
    /// The finest of [`AUTO_STEPS`] that gives at most [`AUTO_POINTS`]
    /// points and that a retained level can serve.
    Auto,
    /// Points of this width: a whole number of minutes, hours or days.
    Every(Duration),
}

impl FromStr for Resolution {
    type Err = UsageError;

    /// `auto`, or a whole number of minutes, hours or days: `1m`, `5m`,
    /// `1h`, `6h`, `1d`, `7d`.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let invalid =
            |reason: &str| UsageError::InvalidInput { field: "resolution", reason: format!("{s:?}: {reason}") };
        if s == "auto" {
            return Ok(Resolution::Auto);
        }
        let split = s.find(|c: char| !c.is_ascii_digit()).ok_or_else(|| invalid("needs a unit (m, h or d)"))?;
        let (number, unit) = s.split_at(split);
        let n: i64 = number.parse().map_err(|_| invalid("expected a number followed by m, h or d"))?;
        if !(1..=366 * 24 * 60).contains(&n) {
            return Err(invalid("must be at least 1 and at most a year"));
        }
        let width = match unit {
            "m" => Duration::minutes(n),
            "h" => Duration::hours(n),
            "d" => Duration::days(n),
            _ => return Err(invalid("the unit must be m, h or d")),
        };
        Ok(Resolution::Every(width))
    }
}

/// How points are split into series.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum GroupBy {
    /// One series per author (agent, `user`, or `(other)` above the cap).
    Agent,
    /// One series per kind of event.
    Kind,
}

impl FromStr for GroupBy {
    type Err = UsageError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "agent" | "author" => Ok(GroupBy::Agent),
            "kind" => Ok(GroupBy::Kind),
            _ => Err(UsageError::InvalidInput { field: "by", reason: format!("{s:?}: expected agent or kind") }),
        }
    }
}

/// A usage question. `window` is required: `None` is refused, never read
/// as "everything".
#[derive(Debug, Clone)]
pub struct UsageQuery {
    /// The app whose usage to read.
    pub app: String,
    /// `[since, until)`.
    pub window: Option<(DateTime<Utc>, DateTime<Utc>)>,
    /// How to split the answer into series; `None` gives one series, `all`.
    pub by: Option<GroupBy>,
    /// The width of each point.
    pub resolution: Resolution,
}

impl UsageQuery {
    /// The last `span` up to now, at automatic resolution.
    pub fn last(app: impl Into<String>, span: Duration) -> Self {
        let until = Utc::now();
        Self { app: app.into(), window: Some((until - span, until)), by: None, resolution: Resolution::Auto }
    }
}

/// How long each level is kept, as the policy says (`None`: kept).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Tiers {
    /// How long minute rows are kept.
    pub minutes: Option<Duration>,
    /// How long hour rows are kept.
    pub hours: Option<Duration>,
    /// How long day rows are kept.
    pub days: Option<Duration>,
}

impl Tiers {
    fn of(&self, level: Level) -> Option<Duration> {
        match level {
            Level::Minute => self.minutes,
            Level::Hour => self.hours,
            Level::Day => self.days,
        }
    }
}

/// What a query will read: one level, one aligned window.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct UsagePlan {
    /// The level read: the coarsest whose buckets divide the resolution
    /// and that is still kept at the window's start.
    pub level: Level,
    /// The width of each point.
    #[serde(serialize_with = "serialize_duration")]
    pub resolution: Duration,
    /// The window's start, floored to the resolution.
    pub since: DateTime<Utc>,
    /// The window's end (exclusive), ceiled to the resolution.
    pub until: DateTime<Utc>,
    /// Points in the window.
    pub points: i64,
}

fn serialize_duration<S: serde::Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(&resolution_text(*d))
}

fn resolution_text(d: Duration) -> String {
    let minutes = d.num_minutes();
    if minutes % (24 * 60) == 0 {
        format!("{}d", minutes / (24 * 60))
    } else if minutes % 60 == 0 {
        format!("{}h", minutes / 60)
    } else {
        format!("{minutes}m")
    }
}

impl UsagePlan {
    /// The one statement the query runs: `$1` app, `$2` since, `$3` until.
    pub fn sql(&self) -> String {
        format!(
            "SELECT {ROW_COLUMNS} FROM {} WHERE app_name = $1 AND bucket_start >= $2 AND bucket_start < $3",
            quote_ident(self.level.table())
        )
    }
}

fn floor_to(at: DateTime<Utc>, step: Duration) -> DateTime<Utc> {
    let step = step.num_seconds().max(1);
    let secs = at.timestamp().div_euclid(step) * step;
    Utc.timestamp_opt(secs, 0).single().unwrap_or(at)
}

/// Chooses the level and aligned window for `query` as of `now`, without
/// touching the database.
pub fn plan(query: &UsageQuery, tiers: &Tiers, now: DateTime<Utc>) -> Result<UsagePlan, UsageError> {
    if query.app.trim().is_empty() {
        return Err(UsageError::InvalidInput { field: "app", reason: "must not be empty".into() });
    }
    let Some((since, until)) = query.window else {
        return Err(UsageError::InvalidInput {
            field: "window",
            reason: "a time window is required (for example the last 24 hours)".into(),
        });
    };
    if since >= until {
        return Err(UsageError::InvalidInput {
            field: "window",
            reason: format!("since ({since}) is not before until ({until})"),
        });
    }
    let holds = |level: Level| tiers.of(level).is_none_or(|keep| since >= now - keep);
    let coarsest_for = |resolution: Duration| {
        [Level::Day, Level::Hour, Level::Minute]
            .into_iter()
            .filter(|level| resolution.num_seconds() % level.width().num_seconds() == 0)
            .find(|level| holds(*level))
    };
    let (resolution, level) = match query.resolution {
        Resolution::Every(resolution) => {
            if resolution.num_seconds() % 60 != 0 || resolution < Duration::minutes(1) {
                return Err(UsageError::InvalidInput {
                    field: "resolution",
                    reason: "must be a whole number of minutes".into(),
                });
            }
            let Some(level) = coarsest_for(resolution) else {
                return Err(UsageError::NotRetained {
                    resolution: resolution_text(resolution),
                    since: since.to_rfc3339(),
                    reason: "the levels that divide it are not kept that long; ask for a coarser resolution".into(),
                });
            };
            (resolution, level)
        }
        Resolution::Auto => {
            let step = AUTO_STEPS
                .into_iter()
                .filter(|step| coarsest_for(*step).is_some())
                .find(|step| points_in(since, until, *step) <= AUTO_POINTS)
                .or_else(|| AUTO_STEPS.into_iter().rev().find(|step| coarsest_for(*step).is_some()))
                .unwrap_or(Duration::days(30));
            let Some(level) = coarsest_for(step) else {
                return Err(UsageError::NotRetained {
                    resolution: "auto".into(),
                    since: since.to_rfc3339(),
                    reason: "no level is kept that long".into(),
                });
            };
            (step, level)
        }
    };
    let points = points_in(since, until, resolution);
    if points > MAX_POINTS {
        return Err(UsageError::TooManyPoints { points, resolution: resolution_text(resolution), max: MAX_POINTS });
    }
    let aligned_since = floor_to(since, resolution);
    let aligned_until = {
        let floor = floor_to(until, resolution);
        if floor == until { until } else { floor + resolution }
    };
    Ok(UsagePlan { level, resolution, since: aligned_since, until: aligned_until, points })
}

fn points_in(since: DateTime<Utc>, until: DateTime<Utc>, step: Duration) -> i64 {
    let step_secs = step.num_seconds().max(1);
    let from = since.timestamp().div_euclid(step_secs);
    let to = (until.timestamp() + step_secs - 1).div_euclid(step_secs);
    to - from
}

/// Three quantiles from a merged sketch, `None` when it saw no value.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct Percentiles {
    /// The median.
    pub p50: Option<f64>,
    /// The 95th percentile.
    pub p95: Option<f64>,
    /// The 99th percentile.
    pub p99: Option<f64>,
}

/// The figures of one point or one series' total.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct UsageFigures {
    /// Events counted.
    pub events: i64,
    /// Events of kind error.
    pub errors: i64,
    /// Payload sizes summed, in bytes.
    pub payload_bytes: i64,
    /// The smallest payload, in bytes; `None` without events.
    pub payload_bytes_min: Option<i32>,
    /// The largest payload, in bytes; `None` without events.
    pub payload_bytes_max: Option<i32>,
    /// `usage_metadata.prompt_token_count` summed.
    pub prompt_tokens: i64,
    /// `usage_metadata.candidates_token_count` summed.
    pub candidates_tokens: i64,
    /// `usage_metadata.total_token_count` summed.
    pub total_tokens: i64,
    /// Exact decimal sum of `usage_metadata.cost`, as text.
    pub cost: Option<String>,
    /// Milliseconds from the previous event of the same invocation.
    pub latency_ms: Percentiles,
    /// Payload sizes, in bytes.
    pub payload_size: Percentiles,
    /// Estimated distinct sessions (HyperLogLog).
    pub sessions: u64,
    /// Estimated distinct users (HyperLogLog).
    pub users: u64,
}

impl UsageFigures {
    /// The figures an aggregate's counts and sketches give.
    pub fn of(aggregate: &Aggregate) -> Self {
        let quantiles = |sketch: &crate::sketch::Quantiles| Percentiles {
            p50: sketch.quantile(0.50),
            p95: sketch.quantile(0.95),
            p99: sketch.quantile(0.99),
        };
        let some = aggregate.events > 0;
        Self {
            events: aggregate.events,
            errors: aggregate.errors,
            payload_bytes: aggregate.payload_bytes,
            payload_bytes_min: some.then_some(aggregate.payload_bytes_min),
            payload_bytes_max: some.then_some(aggregate.payload_bytes_max),
            prompt_tokens: aggregate.prompt_tokens,
            candidates_tokens: aggregate.candidates_tokens,
            total_tokens: aggregate.total_tokens,
            cost: aggregate.cost.as_ref().map(|c: &BigDecimal| c.normalized().to_plain_string()),
            latency_ms: quantiles(&aggregate.latency),
            payload_size: quantiles(&aggregate.size),
            sessions: aggregate.sessions.estimate().round() as u64,
            users: aggregate.users.estimate().round() as u64,
        }
    }
}

/// One point of a series.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct UsagePoint {
    /// The point's start, UTC.
    pub start: DateTime<Utc>,
    /// The figures of the bucket that starts at `start`.
    #[serde(flatten)]
    pub figures: UsageFigures,
}

/// One series: all of the app, or one author or kind of it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct UsageSeries {
    /// `all`, the author, or the kind.
    pub group: String,
    /// The series over the whole window, merged from the same rows.
    pub total: UsageFigures,
    /// Only points with events; missing points had none.
    pub points: Vec<UsagePoint>,
}

/// The answer to a usage query.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct UsageReport {
    /// The app.
    pub app: String,
    /// How series were split; `None`: one series, `all`.
    pub by: Option<GroupBy>,
    /// What was read.
    pub plan: UsagePlan,
    /// The series.
    pub series: Vec<UsageSeries>,
}

#[derive(QueryableByName)]
struct TierRow {
    #[diesel(sql_type = Nullable<BigInt>)]
    minutes: Option<i64>,
    #[diesel(sql_type = Nullable<BigInt>)]
    hours: Option<i64>,
    #[diesel(sql_type = Nullable<BigInt>)]
    days: Option<i64>,
    #[diesel(sql_type = Timestamptz)]
    now: DateTime<Utc>,
}

/// The policy's tiers and the server's clock.
pub async fn tiers(conn: &mut AsyncPgConnection) -> Result<(Tiers, DateTime<Utc>), UsageError> {
    let row = diesel::sql_query(
        "SELECT extract(epoch FROM adk_policy_seconds(p.usage_minute_retention))::bigint AS minutes,
                extract(epoch FROM adk_policy_seconds(p.usage_hour_retention))::bigint AS hours,
                extract(epoch FROM adk_policy_seconds(p.usage_day_retention))::bigint AS days,
                now() AS now
         FROM adk_store_policy p",
    )
    .load::<TierRow>(conn)
    .await
    .map_err(UsageError::query("read the usage tiers"))?
    .into_iter()
    .next()
    .ok_or_else(|| UsageError::Corrupt("the store policy row is missing".into()))?;
    let secs = |s: Option<i64>| s.map(Duration::seconds);
    Ok((Tiers { minutes: secs(row.minutes), hours: secs(row.hours), days: secs(row.days) }, row.now))
}

/// Answers `query` on `conn`, connected as the store's owner: usage is an
/// operator's view, and the policy it reads (`adk_store_policy`,
/// `adk_policy_seconds`) is not granted to service roles. The usage tables
/// still carry row-level security, so a role bound to an app that an
/// operator grants reads to sees only that app's rows.
pub async fn usage(conn: &mut AsyncPgConnection, query: &UsageQuery) -> Result<UsageReport, UsageError> {
    let (tiers, now) = tiers(conn).await?;
    let plan = plan(query, &tiers, now)?;
    let rows = diesel::sql_query(plan.sql())
        .bind::<Text, _>(&query.app)
        .bind::<Timestamptz, _>(plan.since)
        .bind::<Timestamptz, _>(plan.until)
        .load::<LevelRow>(conn)
        .await
        .map_err(UsageError::query("read usage rows"))?;
    let mut points: BTreeMap<(String, DateTime<Utc>), Aggregate> = BTreeMap::new();
    let mut totals: BTreeMap<String, Aggregate> = BTreeMap::new();
    for row in rows {
        let (key, aggregate) = row.decode().map_err(|e| UsageError::Corrupt(e.to_string()))?;
        let group = match query.by {
            None => "all".to_owned(),
            Some(GroupBy::Agent) => key.author.to_string(),
            Some(GroupBy::Kind) => key.kind.to_string(),
        };
        let start = plan.since
            + plan.resolution * ((key.start - plan.since).num_seconds() / plan.resolution.num_seconds()) as i32;
        points.entry((group.clone(), start)).or_default().merge(&aggregate);
        totals.entry(group).or_default().merge(&aggregate);
    }
    let mut series: Vec<UsageSeries> = totals
        .iter()
        .map(|(group, total)| UsageSeries { group: group.clone(), total: UsageFigures::of(total), points: Vec::new() })
        .collect();
    for ((group, start), aggregate) in &points {
        if let Some(s) = series.iter_mut().find(|s| &s.group == group) {
            s.points.push(UsagePoint { start: *start, figures: UsageFigures::of(aggregate) });
        }
    }
    series.sort_by(|a, b| b.total.events.cmp(&a.total.events).then_with(|| a.group.cmp(&b.group)));
    Ok(UsageReport { app: query.app.clone(), by: query.by, plan, series })
}

/// Connects with a statement timeout and answers `query`.
pub async fn usage_at(database_url: &str, query: &UsageQuery) -> Result<UsageReport, UsageError> {
    use diesel_async::SimpleAsyncConnection;
    let mut conn =
        adk_postgres_operations::connect(database_url, "adk-pg usage", &adk_postgres_operations::LockPolicy::default())
            .await?;
    conn.batch_execute(&format!("SET statement_timeout = {STATEMENT_TIMEOUT_MS}"))
        .await
        .map_err(UsageError::query("set the statement timeout"))?;
    usage(&mut conn, query).await
}

impl fmt::Display for UsageReport {
    /// A table per series: one line per point with events, tokens, errors,
    /// latency percentiles and distinct sessions and users, then the total.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "usage of {} from {} to {}, {} points from the {} rollups",
            self.app,
            self.plan.since.to_rfc3339(),
            self.plan.until.to_rfc3339(),
            resolution_text(self.plan.resolution),
            self.plan.level
        )?;
        if self.series.is_empty() {
            return f.write_str("no events in this window");
        }
        let ms = |v: Option<f64>| v.map_or_else(|| "-".to_owned(), |v| format!("{v:.1}"));
        for series in &self.series {
            let mut table = comfy_table::Table::new();
            table.load_style(comfy_table::presets::UTF8_FULL_CONDENSED).set_header([
                "start", "events", "errors", "tokens", "cost", "p50 ms", "p95 ms", "p99 ms", "sessions", "users",
            ]);
            let row = |label: String, figures: &UsageFigures| {
                vec![
                    label,
                    figures.events.to_string(),
                    figures.errors.to_string(),
                    figures.total_tokens.to_string(),
                    figures.cost.clone().unwrap_or_else(|| "-".into()),
                    ms(figures.latency_ms.p50),
                    ms(figures.latency_ms.p95),
                    ms(figures.latency_ms.p99),
                    figures.sessions.to_string(),
                    figures.users.to_string(),
                ]
            };
            for point in &series.points {
                table.add_row(row(point.start.format("%Y-%m-%d %H:%M").to_string(), &point.figures));
            }
            table.add_row(row("total".into(), &series.total));
            writeln!(f, "\n{}", series.group)?;
            writeln!(f, "{table}")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(s: &str) -> DateTime<Utc> {
        DateTime::parse_from_rfc3339(s).expect("rfc3339").with_timezone(&Utc)
    }

    const TIERS: Tiers = Tiers { minutes: Some(Duration::days(14)), hours: Some(Duration::days(400)), days: None };

    fn query(since: &str, until: &str, resolution: &str) -> UsageQuery {
        UsageQuery {
            app: "app".into(),
            window: Some((at(since), at(until))),
            by: None,
            resolution: resolution.parse().expect("resolution"),
        }
    }

    #[test]
    fn routes_to_the_coarsest_level_that_divides_the_resolution() {
        let now = at("2026-12-01T12:00:00Z");
        let day = plan(&query("2026-11-30T12:00:00Z", "2026-12-01T12:00:00Z", "auto"), &TIERS, now).expect("plan");
        assert_eq!((day.level, resolution_text(day.resolution), day.points), (Level::Minute, "5m".into(), 288));
        let week = plan(&query("2026-11-24T12:00:00Z", "2026-12-01T12:00:00Z", "auto"), &TIERS, now).expect("plan");
        assert_eq!((week.level, resolution_text(week.resolution)), (Level::Hour, "1h".into()));
        let year = plan(&query("2025-12-01T00:00:00Z", "2026-12-01T00:00:00Z", "auto"), &TIERS, now).expect("plan");
        assert_eq!((year.level, resolution_text(year.resolution)), (Level::Day, "1d".into()));
        let hours = plan(&query("2026-11-30T12:00:00Z", "2026-12-01T12:00:00Z", "1h"), &TIERS, now).expect("plan");
        assert_eq!(hours.level, Level::Hour);
        let days = plan(&query("2026-11-01T00:00:00Z", "2026-12-01T00:00:00Z", "1d"), &TIERS, now).expect("plan");
        assert_eq!(days.level, Level::Day);
        // Minutes are kept 14 days: an hour-old window of 5m points reads
        // minutes, a month-old one cannot.
        let old = plan(&query("2026-10-01T00:00:00Z", "2026-10-02T00:00:00Z", "5m"), &TIERS, now);
        assert!(matches!(old, Err(UsageError::NotRetained { .. })), "{old:?}");
        let old_auto = plan(&query("2026-10-01T00:00:00Z", "2026-10-02T00:00:00Z", "auto"), &TIERS, now).expect("plan");
        assert_eq!(old_auto.level, Level::Hour);
    }

    #[test]
    fn refuses_no_window_too_many_points_and_bad_input() {
        let now = at("2026-12-01T12:00:00Z");
        let mut no_window = query("2026-11-30T12:00:00Z", "2026-12-01T12:00:00Z", "auto");
        no_window.window = None;
        assert!(matches!(plan(&no_window, &TIERS, now), Err(UsageError::InvalidInput { field: "window", .. })));
        let many = plan(&query("2026-11-20T12:00:00Z", "2026-12-01T12:00:00Z", "1m"), &TIERS, now);
        assert!(matches!(many, Err(UsageError::TooManyPoints { points: 15840, max: MAX_POINTS, .. })), "{many:?}");
        let backwards = plan(&query("2026-12-01T12:00:00Z", "2026-11-30T12:00:00Z", "auto"), &TIERS, now);
        assert!(matches!(backwards, Err(UsageError::InvalidInput { field: "window", .. })));
        for bad in ["", "0m", "5", "1w", "m", "-1h"] {
            assert!(
                matches!(bad.parse::<Resolution>(), Err(UsageError::InvalidInput { field: "resolution", .. })),
                "{bad}"
            );
        }
    }

    #[test]
    fn costs_print_as_plain_decimals() {
        let aggregate =
            Aggregate { events: 1, cost: Some("0.00000025".parse().expect("decimal")), ..Aggregate::default() };
        assert_eq!(UsageFigures::of(&aggregate).cost.as_deref(), Some("0.00000025"));
        let aggregate = Aggregate { events: 1, cost: Some("1.500".parse().expect("decimal")), ..Aggregate::default() };
        assert_eq!(UsageFigures::of(&aggregate).cost.as_deref(), Some("1.5"));
    }

    #[test]
    fn windows_are_aligned_to_whole_points() {
        let now = at("2026-12-01T12:00:00Z");
        let p = plan(&query("2026-11-30T12:07:30Z", "2026-12-01T11:58:00Z", "1h"), &TIERS, now).expect("plan");
        assert_eq!((p.since, p.until), (at("2026-11-30T12:00:00Z"), at("2026-12-01T12:00:00Z")));
        assert_eq!(p.points, 24);
    }
}
