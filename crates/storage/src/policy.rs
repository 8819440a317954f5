//! The store's policy row (`adk_store_policy`): reading it, changing it and
//! reading the record of its changes.
//!
//! The row is the one source of truth for the session lifetime appends
//! enforce, the retention maintenance keeps after it, the default TTL and
//! the days of partitions premade ahead; [`StorePolicy`] is its Rust face.
//! The same row holds the usage rollups' lateness window and the retention
//! of each rollup tier ([`UsagePolicy`]); they are read, checked and
//! changed by the same functions, so a change of either is one
//! compare-and-set of the whole row.
//! Intervals are read the way the SQL side reads them
//! (`adk_policy_seconds`): a day is 24 hours and a month 30 days, so no
//! reading depends on the server's TimeZone.
//!
//! Every writing statement here is read to its end with `load`: diesel-async's
//! `get_result`/`first` return on the first row, before PostgreSQL's
//! ReadyForQuery, so a failure the server reports at commit would go unseen.

use std::time::Duration;

use adk_postgres_domain::{StoreError, StorePolicy};
use adk_postgres_schema::tables::{adk_store_policy, adk_store_policy_changes};
use chrono::{DateTime, Utc};
use diesel::data_types::PgInterval;
use diesel::pg::Pg;
use diesel::prelude::*;
use diesel::result::{DatabaseErrorKind, Error as DieselError};
use diesel::sql_types::{Integer, Interval, Nullable};
use diesel_async::{AsyncPgConnection, RunQueryDsl};
use serde_json::Value;

use crate::error::from_diesel;

const MICROS_PER_DAY: i128 = 86_400_000_000;

/// How often [`amend_policy`] re-reads and tries again when another writer
/// changed the row between its read and its write.
const AMEND_ATTEMPTS: u32 = 5;

/// The rollups' tiers are a type of the domain, like [`StorePolicy`]; they
/// are named here too because this module reads and writes them.
pub use adk_postgres_domain::policy::{MAX_USAGE_LATENESS, MIN_USAGE_LATENESS, UsagePolicy};

/// The whole policy row: the store's policy and the usage rollups' tiers.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PolicySettings {
    /// Session lifetime, retention, default TTL and premade days.
    pub store: StorePolicy,
    /// The usage rollups' lateness window and tier retention.
    pub usage: UsagePolicy,
}

impl PolicySettings {
    /// Both halves checked, the store's first.
    pub fn validate(&self) -> Result<(), StoreError> {
        self.store.validate()?;
        self.usage.validate()
    }
}

/// A partial change of the policy: `None` keeps the current value.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PolicyAmendment {
    /// A new [`StorePolicy::max_session_lifetime`].
    pub max_session_lifetime: Option<Duration>,
    /// A new [`StorePolicy::retention`].
    pub retention: Option<Duration>,
    /// `Some(None)` removes the default TTL.
    pub default_ttl: Option<Option<Duration>>,
    /// A new [`StorePolicy::premake_days`].
    pub premake_days: Option<u32>,
    /// A new [`UsagePolicy::lateness`].
    pub usage_lateness: Option<Duration>,
    /// A new [`UsagePolicy::minute_retention`].
    pub usage_minute_retention: Option<Duration>,
    /// A new [`UsagePolicy::hour_retention`].
    pub usage_hour_retention: Option<Duration>,
    /// `Some(None)` keeps day rows for ever.
    pub usage_day_retention: Option<Option<Duration>>,
}

impl PolicyAmendment {
    /// Whether the amendment asks for any change at all.
    pub fn is_empty(&self) -> bool {
        *self == Self::default()
    }

    /// `current` with the amended fields replaced.
    pub fn apply(&self, current: &StorePolicy) -> StorePolicy {
        StorePolicy {
            max_session_lifetime: self.max_session_lifetime.unwrap_or(current.max_session_lifetime),
            retention: self.retention.unwrap_or(current.retention),
            default_ttl: self.default_ttl.unwrap_or(current.default_ttl),
            premake_days: self.premake_days.unwrap_or(current.premake_days),
        }
    }

    /// `current` usage tiers with the amended fields replaced.
    pub fn apply_usage(&self, current: &UsagePolicy) -> UsagePolicy {
        UsagePolicy {
            lateness: self.usage_lateness.unwrap_or(current.lateness),
            minute_retention: self.usage_minute_retention.unwrap_or(current.minute_retention),
            hour_retention: self.usage_hour_retention.unwrap_or(current.hour_retention),
            day_retention: self.usage_day_retention.unwrap_or(current.day_retention),
        }
    }

    /// The whole row `current` would become.
    pub fn apply_settings(&self, current: &PolicySettings) -> PolicySettings {
        PolicySettings { store: self.apply(&current.store), usage: self.apply_usage(&current.usage) }
    }
}

/// One recorded change of the policy, as the trigger on `adk_store_policy`
/// wrote it: the whole row before and after (`updated_at`/`updated_by`
/// included), intervals as PostgreSQL prints them.
#[derive(Debug, Clone, PartialEq)]
pub struct PolicyChange {
    /// The change's number, assigned in increasing order.
    pub change_id: i64,
    /// When the changing transaction started (`now()`).
    pub changed_at: DateTime<Utc>,
    /// The database role that made the change (`current_user`).
    pub changed_by: String,
    /// The whole row before, as JSON.
    pub before: Value,
    /// The whole row after, as JSON.
    pub after: Value,
}

impl PolicyChange {
    /// The policy fields whose value differs, as (field, before, after);
    /// an interval printed differently but equal is not a change, and the
    /// bookkeeping columns `updated_at` and `updated_by` are left out.
    pub fn changed_fields(&self) -> Vec<(String, Value, Value)> {
        let (Some(before), Some(after)) = (self.before.as_object(), self.after.as_object()) else {
            return Vec::new();
        };
        let mut fields: Vec<(String, Value, Value)> = after
            .iter()
            .filter(|(key, _)| !matches!(key.as_str(), "updated_at" | "updated_by"))
            .filter_map(|(key, new)| {
                let old = before.get(key).cloned().unwrap_or(Value::Null);
                (!same_value(&old, new)).then(|| (key.clone(), old, new.clone()))
            })
            .collect();
        fields.sort_by(|a, b| a.0.cmp(&b.0));
        fields
    }
}

/// Equal, or the same interval printed two ways (`7 days`, `168:00:00`).
fn same_value(a: &Value, b: &Value) -> bool {
    if a == b {
        return true;
    }
    match (a.as_str().and_then(printed_interval), b.as_str().and_then(printed_interval)) {
        (Some(a), Some(b)) => a == b,
        _ => false,
    }
}

/// The policy row; its types come from the generated schema, checked when
/// this compiles.
#[derive(QueryableByName, Queryable, Selectable)]
#[diesel(table_name = adk_store_policy, check_for_backend(Pg))]
struct PolicyRow {
    max_session_lifetime: PgInterval,
    retention: PgInterval,
    default_ttl: Option<PgInterval>,
    premake_days: i32,
}

/// The usage columns of the policy row.
#[derive(QueryableByName, Queryable, Selectable)]
#[diesel(table_name = adk_store_policy, check_for_backend(Pg))]
struct UsageRow {
    usage_lateness: PgInterval,
    usage_minute_retention: PgInterval,
    usage_hour_retention: PgInterval,
    usage_day_retention: Option<PgInterval>,
}

impl UsageRow {
    fn into_usage(self) -> Result<UsagePolicy, StoreError> {
        Ok(UsagePolicy {
            lateness: duration_of("usage_lateness", &self.usage_lateness)?,
            minute_retention: duration_of("usage_minute_retention", &self.usage_minute_retention)?,
            hour_retention: duration_of("usage_hour_retention", &self.usage_hour_retention)?,
            day_retention: self
                .usage_day_retention
                .as_ref()
                .map(|days| duration_of("usage_day_retention", days))
                .transpose()?,
        })
    }
}

/// The whole policy row.
#[derive(QueryableByName, Queryable, Selectable)]
#[diesel(table_name = adk_store_policy, check_for_backend(Pg))]
struct SettingsRow {
    #[diesel(embed)]
    store: PolicyRow,
    #[diesel(embed)]
    usage: UsageRow,
}

impl SettingsRow {
    fn into_settings(self) -> Result<PolicySettings, StoreError> {
        Ok(PolicySettings { store: self.store.into_policy()?, usage: self.usage.into_usage()? })
    }
}

impl PolicyRow {
    fn into_policy(self) -> Result<StorePolicy, StoreError> {
        Ok(StorePolicy {
            max_session_lifetime: duration_of("max_session_lifetime", &self.max_session_lifetime)?,
            retention: duration_of("retention", &self.retention)?,
            default_ttl: self.default_ttl.as_ref().map(|ttl| duration_of("default_ttl", ttl)).transpose()?,
            premake_days: u32::try_from(self.premake_days)
                .map_err(|_| stored_invalid("premake_days", format!("{} is negative", self.premake_days)))?,
        })
    }
}

#[derive(Queryable, Selectable)]
#[diesel(table_name = adk_store_policy_changes, check_for_backend(Pg))]
struct ChangeRow {
    change_id: i64,
    changed_at: DateTime<Utc>,
    changed_by: String,
    before: Value,
    after: Value,
}

fn stored_invalid(field: &str, reason: String) -> StoreError {
    StoreError::Database { message: format!("the stored policy's {field} is unusable: {reason}") }
}

/// An interval as exact seconds, like `adk_policy_seconds`: a day is 24 h,
/// a month 30 days.
pub fn interval_duration(interval: &PgInterval) -> Option<Duration> {
    let micros = i128::from(interval.microseconds)
        + i128::from(interval.days) * MICROS_PER_DAY
        + i128::from(interval.months) * 30 * MICROS_PER_DAY;
    u64::try_from(micros).ok().map(Duration::from_micros)
}

/// Reads an interval as PostgreSQL prints it by default, as the change
/// record holds it (`IntervalStyle` `postgres`: `1 year 2 mons 3 days 04:05:06.5`), with a month as 30 days
/// and a year as 12 months, the policy's exact-seconds reading; `None` for
/// anything else (another style, a negative part), which is shown as is.
pub fn printed_interval(text: &str) -> Option<Duration> {
    const DAY: f64 = 86_400.0;
    let mut seconds = 0.0_f64;
    let mut tokens = text.split_whitespace().peekable();
    tokens.peek()?;
    while let Some(token) = tokens.next() {
        if token.contains(':') {
            let mut parts = token.split(':');
            let (h, m, s) = (parts.next()?, parts.next()?, parts.next().unwrap_or("0"));
            if parts.next().is_some() || token.starts_with('-') {
                return None;
            }
            seconds += h.parse::<f64>().ok()? * 3600.0 + m.parse::<f64>().ok()? * 60.0 + s.parse::<f64>().ok()?;
            continue;
        }
        let amount: f64 = token.parse().ok()?;
        let unit = match tokens.next()?.trim_end_matches('s') {
            "year" => 360.0 * DAY,
            "mon" => 30.0 * DAY,
            "day" => DAY,
            _ => return None,
        };
        if amount < 0.0 {
            return None;
        }
        seconds += amount * unit;
    }
    Duration::try_from_secs_f64(seconds).ok()
}

fn duration_of(field: &str, interval: &PgInterval) -> Result<Duration, StoreError> {
    interval_duration(interval).ok_or_else(|| stored_invalid(field, format!("{interval:?} is negative or too long")))
}

/// A duration as an interval of microseconds only, so PostgreSQL never
/// re-reads it through a calendar.
fn interval_of(field: &str, duration: Duration) -> Result<PgInterval, StoreError> {
    i64::try_from(duration.as_micros())
        .map(PgInterval::from_microseconds)
        .map_err(|_| StoreError::invalid(field, "is too long"))
}

/// The field a CHECK constraint of `adk_store_policy` guards.
fn policy_field(constraint: &str) -> Option<&'static str> {
    match constraint {
        "adk_store_policy_lifetime_positive" => Some("max_session_lifetime"),
        "adk_store_policy_retention_covers_lifetime" => Some("retention"),
        "adk_store_policy_ttl_positive" => Some("default_ttl"),
        "adk_store_policy_premake_days_range" => Some("premake_days"),
        "adk_store_policy_usage_lateness_range" => Some("usage_lateness"),
        "adk_store_policy_minute_tier_covers_lateness" => Some("usage_minute_retention"),
        "adk_store_policy_hour_tier_covers_minutes" => Some("usage_hour_retention"),
        "adk_store_policy_day_tier_covers_hours" => Some("usage_day_retention"),
        _ => None,
    }
}

/// Validation runs before any write; this is the backstop for a value the
/// database refuses anyway, so the caller still learns which field.
fn from_policy_error(error: DieselError) -> StoreError {
    if let DieselError::DatabaseError(DatabaseErrorKind::CheckViolation, info) = &error
        && let Some(field) = info.constraint_name().and_then(policy_field)
    {
        return StoreError::invalid(field, info.message());
    }
    from_diesel(error, "policy")
}

fn missing_row() -> StoreError {
    StoreError::Database {
        message: "the store policy row (adk_store_policy) is missing; run the migrations (adk-pg migrate)".into(),
    }
}

const COLUMNS: &str = "max_session_lifetime, retention, default_ttl, premake_days";
const USAGE_COLUMNS: &str = "usage_lateness, usage_minute_retention, usage_hour_retention, usage_day_retention";

/// The policy in force.
pub async fn read_policy(conn: &mut AsyncPgConnection) -> Result<StorePolicy, StoreError> {
    // The owner's read of a plain table: diesel's query builder, kept
    // prepared, one round trip.
    adk_store_policy::table
        .filter(adk_store_policy::id)
        .select(PolicyRow::as_select())
        .load::<PolicyRow>(conn)
        .await
        .map_err(from_policy_error)?
        .into_iter()
        .next()
        .ok_or_else(missing_row)?
        .into_policy()
}

/// The whole policy row: the store's policy and the usage tiers.
pub async fn read_policy_settings(conn: &mut AsyncPgConnection) -> Result<PolicySettings, StoreError> {
    adk_store_policy::table
        .filter(adk_store_policy::id)
        .select(SettingsRow::as_select())
        .load::<SettingsRow>(conn)
        .await
        .map_err(from_policy_error)?
        .into_iter()
        .next()
        .ok_or_else(missing_row)?
        .into_settings()
}

/// The usage rollups' lateness window and tiers.
pub async fn read_usage_policy(conn: &mut AsyncPgConnection) -> Result<UsagePolicy, StoreError> {
    Ok(read_policy_settings(conn).await?.usage)
}

/// Replaces the usage tiers with `usage` and returns what is now stored;
/// the store's policy is left as it is. Inconsistent tiers are refused
/// before anything is written, naming the field. The change is recorded.
pub async fn set_usage_policy(conn: &mut AsyncPgConnection, usage: &UsagePolicy) -> Result<UsagePolicy, StoreError> {
    usage.validate()?;
    let binds = UsageBinds::of(usage)?;
    diesel::sql_query(format!(
        "UPDATE adk_store_policy
            SET usage_lateness = $1, usage_minute_retention = $2, usage_hour_retention = $3,
                usage_day_retention = $4
          WHERE id
      RETURNING {USAGE_COLUMNS}"
    ))
    .bind::<Interval, _>(binds.lateness)
    .bind::<Interval, _>(binds.minutes)
    .bind::<Interval, _>(binds.hours)
    .bind::<Nullable<Interval>, _>(binds.days)
    .load::<UsageRow>(conn)
    .await
    .map_err(from_policy_error)?
    .into_iter()
    .next()
    .ok_or_else(missing_row)?
    .into_usage()
}

/// Replaces the policy with `policy` and returns what is now stored. An
/// invalid policy is refused before anything is written, with an error
/// naming the field. The change is recorded (see [`policy_changes`]).
pub async fn set_policy(conn: &mut AsyncPgConnection, policy: &StorePolicy) -> Result<StorePolicy, StoreError> {
    policy.validate()?;
    let binds = Binds::of(policy)?;
    diesel::sql_query(format!(
        "UPDATE adk_store_policy
            SET max_session_lifetime = $1, retention = $2, default_ttl = $3, premake_days = $4
          WHERE id
      RETURNING {COLUMNS}"
    ))
    .bind::<Interval, _>(binds.lifetime)
    .bind::<Interval, _>(binds.retention)
    .bind::<Nullable<Interval>, _>(binds.default_ttl)
    .bind::<Integer, _>(binds.premake_days)
    .load::<PolicyRow>(conn)
    .await
    .map_err(from_policy_error)?
    .into_iter()
    .next()
    .ok_or_else(missing_row)?
    .into_policy()
}

/// Changes the fields `amendment` names and keeps the others, as one
/// compare-and-set: a concurrent change of another field is never
/// overwritten with its old value. Validates the resulting policy before
/// writing anything. Returns the store's policy now stored; see
/// [`amend_policy_settings`] for the whole row.
pub async fn amend_policy(
    conn: &mut AsyncPgConnection,
    amendment: &PolicyAmendment,
) -> Result<StorePolicy, StoreError> {
    Ok(amend_policy_settings(conn, amendment).await?.store)
}

/// [`amend_policy`], returning the whole row now stored, usage tiers
/// included.
pub async fn amend_policy_settings(
    conn: &mut AsyncPgConnection,
    amendment: &PolicyAmendment,
) -> Result<PolicySettings, StoreError> {
    for _ in 0..AMEND_ATTEMPTS {
        let current = read_policy_settings(conn).await?;
        let wanted = amendment.apply_settings(&current);
        wanted.validate()?;
        let (old, new) = (Binds::of(&current.store)?, Binds::of(&wanted.store)?);
        let (old_usage, new_usage) = (UsageBinds::of(&current.usage)?, UsageBinds::of(&wanted.usage)?);
        // Every column is compared, so the row written is exactly the one
        // read plus this amendment, whichever half another writer changed.
        let rows = diesel::sql_query(format!(
            "UPDATE adk_store_policy
                SET max_session_lifetime = $1, retention = $2, default_ttl = $3, premake_days = $4,
                    usage_lateness = $5, usage_minute_retention = $6, usage_hour_retention = $7,
                    usage_day_retention = $8
              WHERE id
                AND (max_session_lifetime, retention, default_ttl, premake_days,
                     usage_lateness, usage_minute_retention, usage_hour_retention, usage_day_retention)
                    IS NOT DISTINCT FROM ($9::interval, $10::interval, $11::interval, $12::integer,
                                          $13::interval, $14::interval, $15::interval, $16::interval)
          RETURNING {COLUMNS}, {USAGE_COLUMNS}"
        ))
        .bind::<Interval, _>(new.lifetime)
        .bind::<Interval, _>(new.retention)
        .bind::<Nullable<Interval>, _>(new.default_ttl)
        .bind::<Integer, _>(new.premake_days)
        .bind::<Interval, _>(new_usage.lateness)
        .bind::<Interval, _>(new_usage.minutes)
        .bind::<Interval, _>(new_usage.hours)
        .bind::<Nullable<Interval>, _>(new_usage.days)
        .bind::<Interval, _>(old.lifetime)
        .bind::<Interval, _>(old.retention)
        .bind::<Nullable<Interval>, _>(old.default_ttl)
        .bind::<Integer, _>(old.premake_days)
        .bind::<Interval, _>(old_usage.lateness)
        .bind::<Interval, _>(old_usage.minutes)
        .bind::<Interval, _>(old_usage.hours)
        .bind::<Nullable<Interval>, _>(old_usage.days)
        .load::<SettingsRow>(conn)
        .await
        .map_err(from_policy_error)?;
        if let Some(row) = rows.into_iter().next() {
            return row.into_settings();
        }
    }
    Err(StoreError::Conflict { message: "the store policy kept changing while it was being amended".into() })
}

/// The recorded changes of the policy, newest first, at most `limit`.
pub async fn policy_changes(conn: &mut AsyncPgConnection, limit: i64) -> Result<Vec<PolicyChange>, StoreError> {
    if limit < 1 {
        return Err(StoreError::invalid("limit", "must be at least 1"));
    }
    let rows = adk_store_policy_changes::table
        .order(adk_store_policy_changes::change_id.desc())
        .limit(limit)
        .select(ChangeRow::as_select())
        .load::<ChangeRow>(conn)
        .await
        .map_err(|e| from_diesel(e, "policy"))?;
    Ok(rows
        .into_iter()
        .map(|r| PolicyChange {
            change_id: r.change_id,
            changed_at: r.changed_at,
            changed_by: r.changed_by,
            before: r.before,
            after: r.after,
        })
        .collect())
}

struct Binds {
    lifetime: PgInterval,
    retention: PgInterval,
    default_ttl: Option<PgInterval>,
    premake_days: i32,
}

impl Binds {
    fn of(policy: &StorePolicy) -> Result<Self, StoreError> {
        Ok(Self {
            lifetime: interval_of("max_session_lifetime", policy.max_session_lifetime)?,
            retention: interval_of("retention", policy.retention)?,
            default_ttl: policy.default_ttl.map(|ttl| interval_of("default_ttl", ttl)).transpose()?,
            premake_days: i32::try_from(policy.premake_days)
                .map_err(|_| StoreError::invalid("premake_days", "is too large"))?,
        })
    }
}

struct UsageBinds {
    lateness: PgInterval,
    minutes: PgInterval,
    hours: PgInterval,
    days: Option<PgInterval>,
}

impl UsageBinds {
    fn of(usage: &UsagePolicy) -> Result<Self, StoreError> {
        Ok(Self {
            lateness: interval_of("usage_lateness", usage.lateness)?,
            minutes: interval_of("usage_minute_retention", usage.minute_retention)?,
            hours: interval_of("usage_hour_retention", usage.hour_retention)?,
            days: usage.day_retention.map(|days| interval_of("usage_day_retention", days)).transpose()?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_intervals_with_fixed_days_and_months() {
        let interval = PgInterval { microseconds: 1_500_000, days: 2, months: 1 };
        assert_eq!(interval_duration(&interval), Some(Duration::from_micros(1_500_000 + 32 * 86_400_000_000)));
        assert_eq!(interval_duration(&PgInterval::from_microseconds(-1)), None);
        assert_eq!(
            interval_of("x", Duration::from_secs(3600)).ok(),
            Some(PgInterval::from_microseconds(3_600_000_000))
        );
    }

    #[test]
    fn names_the_field_of_each_policy_constraint() {
        assert_eq!(policy_field("adk_store_policy_retention_covers_lifetime"), Some("retention"));
        assert_eq!(policy_field("adk_store_policy_lifetime_positive"), Some("max_session_lifetime"));
        assert_eq!(policy_field("adk_store_policy_ttl_positive"), Some("default_ttl"));
        assert_eq!(policy_field("adk_store_policy_premake_days_range"), Some("premake_days"));
        assert_eq!(policy_field("adk_store_policy_usage_lateness_range"), Some("usage_lateness"));
        assert_eq!(policy_field("adk_store_policy_minute_tier_covers_lateness"), Some("usage_minute_retention"));
        assert_eq!(policy_field("adk_store_policy_hour_tier_covers_minutes"), Some("usage_hour_retention"));
        assert_eq!(policy_field("adk_store_policy_day_tier_covers_hours"), Some("usage_day_retention"));
        assert_eq!(policy_field("adk_sessions_state_size"), None);
    }

    #[test]
    fn an_amendment_keeps_what_it_does_not_name() {
        let current = StorePolicy::default();
        let amendment = PolicyAmendment { retention: Some(Duration::from_secs(3600 * 24 * 90)), ..Default::default() };
        let amended = amendment.apply(&current);
        assert_eq!(amended.retention, Duration::from_secs(3600 * 24 * 90));
        assert_eq!(amended.max_session_lifetime, current.max_session_lifetime);
        let cleared = PolicyAmendment { default_ttl: Some(None), ..Default::default() }
            .apply(&StorePolicy { default_ttl: Some(Duration::from_secs(60)), ..current });
        assert_eq!(cleared.default_ttl, None);
        assert!(PolicyAmendment::default().is_empty());
    }

    #[test]
    fn inconsistent_usage_tiers_name_the_field_that_must_be_longer() {
        const DAY: Duration = Duration::from_secs(86_400);
        UsagePolicy::default().validate().expect("the migration's tiers are valid");
        let field = |usage: UsagePolicy| match usage.validate() {
            Err(StoreError::InvalidInput { field, .. }) => field,
            other => panic!("expected invalid input, got {other:?}"),
        };
        let base = UsagePolicy::default();
        assert_eq!(field(UsagePolicy { lateness: Duration::from_secs(59), ..base }), "usage_lateness");
        assert_eq!(field(UsagePolicy { lateness: DAY * 8, ..base }), "usage_lateness");
        assert_eq!(field(UsagePolicy { minute_retention: DAY, ..base }), "usage_minute_retention");
        assert_eq!(field(UsagePolicy { hour_retention: DAY * 13, ..base }), "usage_hour_retention");
        assert_eq!(field(UsagePolicy { day_retention: Some(DAY * 399), ..base }), "usage_day_retention");
        // Exactly the bounds the CHECK constraints allow.
        let tight = UsagePolicy {
            lateness: Duration::from_secs(60),
            minute_retention: DAY + Duration::from_secs(60),
            hour_retention: DAY + Duration::from_secs(60),
            day_retention: Some(DAY + Duration::from_secs(60)),
        };
        tight.validate().expect("the tightest consistent tiers");
        let huge = UsagePolicy { minute_retention: Duration::MAX, hour_retention: Duration::MAX, ..base };
        huge.validate().expect("no overflow on enormous tiers");
        assert!(matches!(UsageBinds::of(&huge), Err(StoreError::InvalidInput { .. })));
    }

    #[test]
    fn an_amendment_of_the_tiers_keeps_the_rest() {
        const DAY: Duration = Duration::from_secs(86_400);
        let amendment = PolicyAmendment {
            usage_minute_retention: Some(DAY * 7),
            usage_day_retention: Some(Some(DAY * 800)),
            ..Default::default()
        };
        let amended = amendment.apply_settings(&PolicySettings::default());
        assert_eq!(amended.store, StorePolicy::default());
        assert_eq!(
            amended.usage,
            UsagePolicy { minute_retention: DAY * 7, day_retention: Some(DAY * 800), ..UsagePolicy::default() }
        );
        assert!(!amendment.is_empty());
    }

    #[test]
    fn reads_intervals_as_postgres_prints_them() {
        let day = Duration::from_secs(86_400);
        assert_eq!(printed_interval("30 days"), Some(day * 30));
        assert_eq!(printed_interval("1 mon"), Some(day * 30));
        assert_eq!(printed_interval("168:00:00"), Some(day * 7));
        assert_eq!(printed_interval("1 day 01:30:00"), Some(day + Duration::from_secs(5400)));
        assert_eq!(printed_interval("00:00:01.5"), Some(Duration::from_millis(1500)));
        assert_eq!(printed_interval("-1 days"), None);
        assert_eq!(printed_interval("P1D"), None);
        assert_eq!(printed_interval(""), None);
    }

    #[test]
    fn lists_only_the_changed_policy_fields() {
        let change = PolicyChange {
            change_id: 1,
            changed_at: DateTime::<Utc>::UNIX_EPOCH,
            changed_by: "postgres".into(),
            before: serde_json::json!({"retention": "30 days", "max_session_lifetime": "7 days", "updated_by": "a"}),
            after: serde_json::json!({"retention": "240:00:00", "max_session_lifetime": "168:00:00", "updated_by": "b"}),
        };
        assert_eq!(
            change.changed_fields(),
            vec![("retention".to_owned(), serde_json::json!("30 days"), serde_json::json!("240:00:00"))]
        );
    }
}
