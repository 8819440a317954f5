//! What the store's policy means for retiring days: which days are past
//! lifetime plus retention, and which of them still hold a live session.
//!
//! All of it is judged as of the start of a UTC day with plain
//! `NaiveDateTime` arithmetic, so neither the server's nor this process's
//! TimeZone moves a cutoff.

use std::fmt;
use std::time::Duration;

use adk_postgres_domain::StorePolicy;
use adk_postgres_storage::policy::{PolicySettings, UsagePolicy};
use chrono::{DateTime, Datelike, NaiveDate, NaiveTime, TimeDelta, Utc};
use diesel::QueryableByName;
use diesel::sql_types::{BigInt, Bool, Date, Nullable, Timestamptz};
use diesel_async::{AsyncPgConnection, RunQueryDsl};
use serde::Serialize;

use crate::RetentionError;
use adk_postgres_operations::first_row;

/// The policy in a report: whole seconds (sub-second parts are dropped).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PolicySummary {
    /// [`StorePolicy::max_session_lifetime`].
    pub max_session_lifetime_secs: u64,
    /// [`StorePolicy::retention`].
    pub retention_secs: u64,
    /// `None`: sessions live until deleted unless the client asks otherwise.
    pub default_ttl_secs: Option<u64>,
    /// [`StorePolicy::premake_days`].
    pub premake_days: u32,
    /// The usage rollups' lateness and tiers; `None` before migration 12.
    pub usage: Option<UsageSummary>,
}

/// The usage part of the policy in a report, in whole seconds.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct UsageSummary {
    /// [`UsagePolicy::lateness`].
    pub lateness_secs: u64,
    /// [`UsagePolicy::minute_retention`].
    pub minute_retention_secs: u64,
    /// [`UsagePolicy::hour_retention`].
    pub hour_retention_secs: u64,
    /// `None`: day rows are kept for ever.
    pub day_retention_secs: Option<u64>,
}

impl UsageSummary {
    /// The summary of `usage`.
    pub fn of(usage: &UsagePolicy) -> Self {
        Self {
            lateness_secs: usage.lateness.as_secs(),
            minute_retention_secs: usage.minute_retention.as_secs(),
            hour_retention_secs: usage.hour_retention.as_secs(),
            day_retention_secs: usage.day_retention.map(|days| days.as_secs()),
        }
    }
}

impl PolicySummary {
    /// The summary of `policy`, without the usage tiers.
    pub fn of(policy: &StorePolicy) -> Self {
        Self {
            max_session_lifetime_secs: policy.max_session_lifetime.as_secs(),
            retention_secs: policy.retention.as_secs(),
            default_ttl_secs: policy.default_ttl.map(|ttl| ttl.as_secs()),
            premake_days: policy.premake_days,
            usage: None,
        }
    }

    /// The summary with the usage tiers, when the database has them.
    pub fn with_usage(self, usage: Option<&UsagePolicy>) -> Self {
        Self { usage: usage.map(UsageSummary::of), ..self }
    }
}

/// A policy duration as humantime prints it, except that whole days stay
/// days: humantime's years and months are 365.25 and 30.44 days, which
/// would print the default hour tier (400 days) as `1year 1month 4days 7h
/// 26m 24s`.
pub fn span_text(duration: Duration) -> String {
    const DAY: u64 = 86_400;
    let secs = duration.as_secs();
    match (secs / DAY, secs % DAY, duration.subsec_nanos()) {
        (1, 0, 0) => "1day".to_owned(),
        (days, 0, 0) if days > 0 => format!("{days}days"),
        _ => humantime::format_duration(duration).to_string(),
    }
}

impl fmt::Display for PolicySummary {
    /// The policy on one line, as `adk-pg status` and `adk-pg maintain`
    /// print it.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let secs = |secs: u64| span_text(Duration::from_secs(secs));
        write!(
            f,
            "lifetime {}, retention {}, default TTL ",
            secs(self.max_session_lifetime_secs),
            secs(self.retention_secs)
        )?;
        match self.default_ttl_secs {
            Some(ttl) => write!(f, "{}", secs(ttl))?,
            None => f.write_str("none")?,
        }
        write!(f, ", premake {} day(s)", self.premake_days)?;
        if let Some(usage) = &self.usage {
            write!(
                f,
                "; usage lateness {}, rollups kept 1m {}, 1h {}, 1d ",
                secs(usage.lateness_secs),
                secs(usage.minute_retention_secs),
                secs(usage.hour_retention_secs)
            )?;
            match usage.day_retention_secs {
                Some(days) => write!(f, "{}", secs(days))?,
                None => f.write_str("for ever")?,
            }
        }
        Ok(())
    }
}

/// A day past lifetime plus retention that maintenance did not retire
/// because a session of it is still live.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct KeptDay {
    /// The session day (UTC).
    pub day: NaiveDate,
    /// The partition holding the day, when one is attached.
    pub partition: Option<String>,
    /// Sessions of the day that are open, unexpired and were active within
    /// the retention.
    pub open_sessions: i64,
    /// The latest `updated_at` among them.
    pub last_active: DateTime<Utc>,
    /// Why it was kept, as `adk-pg maintain` prints it.
    pub reason: String,
}

/// The run time of a maintenance or health check for `today`: its start, UTC.
pub fn start_of(today: NaiveDate) -> DateTime<Utc> {
    today.and_time(NaiveTime::MIN).and_utc()
}

/// The first day maintenance keeps as of `today`: day D is retired once the
/// end of D (D + 1 at 00:00 UTC) plus the lifetime plus the retention is no
/// later than the start of `today`, i.e. exactly the days before this one.
pub fn retire_before(policy: &StorePolicy, today: NaiveDate) -> NaiveDate {
    let kept_for = policy.max_session_lifetime.checked_add(policy.retention).and_then(|d| TimeDelta::from_std(d).ok());
    kept_for
        .and_then(|kept_for| today.and_time(NaiveTime::MIN).checked_sub_signed(kept_for))
        .map_or(NaiveDate::MIN, |cutoff| cutoff.date())
}

/// The oldest `updated_at` that still counts as active within the
/// retention, or `None` when the retention reaches before any date
/// PostgreSQL stores (then every update counts).
pub(crate) fn active_since(run_at: DateTime<Utc>, retention: Duration) -> Option<DateTime<Utc>> {
    let since = run_at.checked_sub_signed(TimeDelta::from_std(retention).ok()?)?;
    (since.year() >= 1).then_some(since)
}

/// A live day: open sessions of it were active within the retention.
#[derive(Debug, Clone, PartialEq, Eq, QueryableByName)]
pub(crate) struct LiveDay {
    #[diesel(sql_type = Date)]
    pub day: NaiveDate,
    #[diesel(sql_type = BigInt)]
    pub open_sessions: i64,
    #[diesel(sql_type = Timestamptz)]
    pub last_active: DateTime<Utc>,
}

impl LiveDay {
    pub(crate) fn kept(&self, partition: Option<String>, retention: Duration) -> KeptDay {
        KeptDay {
            day: self.day,
            partition,
            open_sessions: self.open_sessions,
            last_active: self.last_active,
            reason: format!(
                "{} open session(s) of this day, unexpired and active within the retention of {}s \
                 (last at {}); it is retired once they close, expire or stay idle for the retention",
                self.open_sessions,
                retention.as_secs(),
                self.last_active.format("%Y-%m-%d %H:%M:%S UTC")
            ),
        }
    }
}

/// Days before `before` with a session that is still open (not closed by a
/// rollover), not expired at `run_at`, and updated within `retention` of
/// `run_at`: what must not be dropped. Uses the `session_day` index.
pub(crate) async fn live_days(
    conn: &mut AsyncPgConnection,
    before: NaiveDate,
    run_at: DateTime<Utc>,
    retention: Duration,
) -> Result<Vec<LiveDay>, RetentionError> {
    diesel::sql_query(
        "SELECT session_day AS day, count(*) AS open_sessions, max(updated_at) AS last_active
         FROM adk_sessions
         WHERE session_day < $1
           AND closed_at IS NULL
           AND (expires_at IS NULL OR expires_at > $2)
           AND ($3::timestamptz IS NULL OR updated_at > $3)
         GROUP BY session_day
         ORDER BY session_day",
    )
    .bind::<Date, _>(before)
    .bind::<Timestamptz, _>(run_at)
    .bind::<Nullable<Timestamptz>, _>(active_since(run_at, retention))
    .load::<LiveDay>(conn)
    .await
    .map_err(RetentionError::query("find live sessions of days past retention"))
}

#[derive(QueryableByName)]
struct ExistsRow {
    #[diesel(sql_type = Bool)]
    exists: bool,
}

/// Whether migration 12 (usage rollups) is applied: its tables, functions
/// and policy columns arrive together, so one table stands for all.
/// Maintenance and health skip the rollups' share of their work without
/// them rather than fail, so event partitions are kept whatever the state
/// of the analytics.
pub async fn usage_installed(conn: &mut AsyncPgConnection) -> Result<bool, RetentionError> {
    Ok(diesel::sql_query("SELECT to_regclass('adk_usage_state') IS NOT NULL AS exists")
        .load::<ExistsRow>(conn)
        .await
        .and_then(first_row)
        .map_err(RetentionError::query("look for adk_usage_state"))?
        .exists)
}

/// The whole policy row, usage tiers included; `NotMigrated` when the
/// table or its usage columns are missing.
pub async fn policy_settings(conn: &mut AsyncPgConnection) -> Result<PolicySettings, RetentionError> {
    store_policy(conn).await?;
    if !usage_installed(conn).await? {
        return Err(RetentionError::NotMigrated(
            "the usage rollups (migration 12) are not installed; run adk-pg migrate".into(),
        ));
    }
    Ok(adk_postgres_storage::policy::read_policy_settings(conn).await?)
}

/// The usage tiers, or `None` before migration 12.
pub async fn usage_policy(conn: &mut AsyncPgConnection) -> Result<Option<UsagePolicy>, RetentionError> {
    if !usage_installed(conn).await? {
        return Ok(None);
    }
    Ok(Some(adk_postgres_storage::policy::read_usage_policy(conn).await?))
}

/// The policy in the database; `NotMigrated` when the table is missing.
pub async fn store_policy(conn: &mut AsyncPgConnection) -> Result<StorePolicy, RetentionError> {
    let exists = diesel::sql_query("SELECT to_regclass('adk_store_policy') IS NOT NULL AS exists")
        .load::<ExistsRow>(conn)
        .await
        .and_then(first_row)
        .map_err(RetentionError::query("look for adk_store_policy"))?
        .exists;
    if !exists {
        return Err(RetentionError::NotMigrated("table adk_store_policy does not exist; run adk-pg migrate".into()));
    }
    Ok(adk_postgres_storage::read_policy(conn).await?)
}

#[cfg(test)]
mod tests {
    use super::*;

    const DAY: Duration = Duration::from_secs(86_400);

    fn day(text: &str) -> NaiveDate {
        NaiveDate::parse_from_str(text, "%Y-%m-%d").expect("day")
    }

    #[test]
    fn the_default_policy_retires_days_older_than_thirty_seven() {
        // D is retired iff D + 1 + 7 + 30 days <= today.
        assert_eq!(retire_before(&StorePolicy::default(), day("2030-03-01")), day("2030-01-23"));
    }

    #[test]
    fn a_partial_day_keeps_the_day_it_reaches_into() {
        let hours = StorePolicy {
            max_session_lifetime: Duration::from_secs(3600),
            retention: Duration::from_secs(3600),
            ..StorePolicy::default()
        };
        // Yesterday ends at 00:00 today; plus two hours is past the start of today.
        assert_eq!(retire_before(&hours, day("2030-03-01")), day("2030-02-28"));
        let exact = StorePolicy { max_session_lifetime: DAY, retention: DAY, ..StorePolicy::default() };
        assert_eq!(retire_before(&exact, day("2030-03-01")), day("2030-02-27"));
    }

    #[test]
    fn an_enormous_policy_retires_nothing() {
        let forever = StorePolicy { retention: Duration::from_secs(u64::MAX / 4), ..StorePolicy::default() };
        assert_eq!(retire_before(&forever, day("2030-03-01")), NaiveDate::MIN);
        assert_eq!(active_since(start_of(day("2030-03-01")), forever.retention), None);
    }

    #[test]
    fn whole_days_print_as_days() {
        assert_eq!(span_text(DAY), "1day");
        assert_eq!(span_text(DAY * 400), "400days");
        assert_eq!(span_text(DAY * 30), "30days");
        assert_eq!(span_text(Duration::from_secs(90 * 60)), "1h 30m");
        assert_eq!(span_text(DAY + Duration::from_secs(3600)), "1day 1h");
        assert_eq!(span_text(Duration::ZERO), "0s");
    }

    #[test]
    fn the_summary_names_the_usage_tiers_when_there_are_any() {
        let plain = PolicySummary::of(&StorePolicy::default());
        assert_eq!(plain.to_string(), "lifetime 7days, retention 30days, default TTL none, premake 7 day(s)");
        let usage = plain.with_usage(Some(&UsagePolicy::default()));
        assert_eq!(
            usage.to_string(),
            "lifetime 7days, retention 30days, default TTL none, premake 7 day(s); \
             usage lateness 1day, rollups kept 1m 14days, 1h 400days, 1d for ever"
        );
    }

    #[test]
    fn the_activity_window_ends_at_the_run_time() {
        let run_at = start_of(day("2030-03-01"));
        assert_eq!(active_since(run_at, DAY), Some(start_of(day("2030-02-28"))));
    }
}
