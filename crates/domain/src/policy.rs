//! The store's policy: how long a session may live, how long its events are
//! kept after that, the default time to live and how many days of event
//! partitions exist ahead of today.
//!
//! The policy lives in the database (`adk_store_policy`, one row), where the
//! SQL functions and maintenance both read it; this type is its Rust face.
//! A client's `StoreConfig` may only tighten it: the shorter of the two
//! lifetimes and TTLs wins. A day counts as 24 hours and a month as 30 days,
//! whatever the server's TimeZone.
//!
//! The same row holds the usage rollups' tiers ([`UsagePolicy`]): how late
//! an event may arrive and still be rolled up, and how long each level is
//! kept. Reading and writing the row is the storage crate's (`policy`);
//! applying it, retention's.

use std::time::Duration;

use crate::error::StoreError;

const DAY: Duration = Duration::from_secs(24 * 3600);

/// Longest premake horizon accepted: a year of daily partitions.
pub const MAX_PREMAKE_DAYS: u32 = 366;

/// The store-wide policy. [`StorePolicy::default`] is what a fresh
/// migration installs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StorePolicy {
    /// Sessions older than this refuse appends, for every client; they must
    /// be rolled over.
    pub max_session_lifetime: Duration,
    /// How long a session's events are kept after its lifetime has ended;
    /// never shorter than the lifetime.
    pub retention: Duration,
    /// Time to live of a new session when neither the request nor the
    /// client's config asks for a shorter one; `None` keeps sessions until
    /// deleted.
    pub default_ttl: Option<Duration>,
    /// Days after today that must always have an event partition.
    pub premake_days: u32,
}

impl Default for StorePolicy {
    fn default() -> Self {
        Self { max_session_lifetime: DAY * 7, retention: DAY * 30, default_ttl: None, premake_days: 7 }
    }
}

impl StorePolicy {
    /// Refuses a policy that would lose data or leave appends without a
    /// partition; the error names the offending field.
    pub fn validate(&self) -> Result<(), StoreError> {
        if self.max_session_lifetime < Duration::from_secs(1) {
            return Err(StoreError::invalid("max_session_lifetime", "must be at least one second"));
        }
        if self.retention < self.max_session_lifetime {
            return Err(StoreError::invalid(
                "retention",
                format!(
                    "{:?} is shorter than the maximum session lifetime ({:?})",
                    self.retention, self.max_session_lifetime
                ),
            ));
        }
        if self.default_ttl.is_some_and(|ttl| ttl < Duration::from_secs(1)) {
            return Err(StoreError::invalid("default_ttl", "must be at least one second (or none)"));
        }
        if self.premake_days == 0 || self.premake_days > MAX_PREMAKE_DAYS {
            return Err(StoreError::invalid("premake_days", format!("must be between 1 and {MAX_PREMAKE_DAYS}")));
        }
        Ok(())
    }

    /// The lifetime an append is held to: the policy's, or a client's
    /// shorter one.
    pub fn effective_lifetime(&self, client: Option<Duration>) -> Duration {
        client.map_or(self.max_session_lifetime, |c| c.min(self.max_session_lifetime))
    }

    /// The TTL a new session gets: the shortest of the request's, the
    /// client's default and the policy's default, if any is set.
    pub fn effective_ttl(&self, requested: Option<Duration>) -> Option<Duration> {
        match (requested, self.default_ttl) {
            (Some(r), Some(p)) => Some(r.min(p)),
            (r, p) => r.or(p),
        }
    }
}

/// Shortest lateness window the database accepts
/// (`adk_store_policy_usage_lateness_range`).
pub const MIN_USAGE_LATENESS: Duration = Duration::from_secs(60);
/// Longest lateness window the database accepts.
pub const MAX_USAGE_LATENESS: Duration = Duration::from_secs(7 * 86_400);

/// The usage rollups' part of the policy row: how late an event may arrive
/// and still be rolled up, and how long each rollup level is kept.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UsagePolicy {
    /// Events whose own time is further than this from their arrival are
    /// counted as late, not rolled up (1 minute to 7 days).
    pub lateness: Duration,
    /// How long minute rows are kept; at least a day longer than the
    /// lateness window, so a late event still finds the minutes its hour is
    /// recomputed from.
    pub minute_retention: Duration,
    /// How long hour rows are kept; never shorter than the minutes'.
    pub hour_retention: Duration,
    /// How long day rows are kept, `None` for ever; never shorter than the
    /// hours'.
    pub day_retention: Option<Duration>,
}

impl Default for UsagePolicy {
    /// What migration 12 installs.
    fn default() -> Self {
        const DAY: Duration = Duration::from_secs(86_400);
        Self { lateness: DAY, minute_retention: DAY * 14, hour_retention: DAY * 400, day_retention: None }
    }
}

impl UsagePolicy {
    /// Refuses the tiers the database's CHECK constraints would refuse,
    /// naming the field that would have to be longer, so nothing is sent.
    pub fn validate(&self) -> Result<(), StoreError> {
        if self.lateness < MIN_USAGE_LATENESS || self.lateness > MAX_USAGE_LATENESS {
            return Err(StoreError::invalid(
                "usage_lateness",
                format!("{:?} is outside 1 minute to 7 days", self.lateness),
            ));
        }
        let covers_lateness = self.lateness.saturating_add(Duration::from_secs(86_400));
        if self.minute_retention < covers_lateness {
            return Err(StoreError::invalid(
                "usage_minute_retention",
                format!(
                    "{:?} is shorter than the lateness window ({:?}) plus a day",
                    self.minute_retention, self.lateness
                ),
            ));
        }
        if self.hour_retention < self.minute_retention {
            return Err(StoreError::invalid(
                "usage_hour_retention",
                format!(
                    "{:?} is shorter than the minute tier's retention ({:?})",
                    self.hour_retention, self.minute_retention
                ),
            ));
        }
        if let Some(days) = self.day_retention
            && days < self.hour_retention
        {
            return Err(StoreError::invalid(
                "usage_day_retention",
                format!("{days:?} is shorter than the hour tier's retention ({:?})", self.hour_retention),
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_is_valid() {
        StorePolicy::default().validate().expect("valid");
    }

    #[test]
    fn invalid_policies_name_their_field() {
        let field = |p: StorePolicy| match p.validate() {
            Err(StoreError::InvalidInput { field, .. }) => field,
            other => panic!("expected invalid input, got {other:?}"),
        };
        let base = StorePolicy::default();
        assert_eq!(field(StorePolicy { retention: DAY, ..base.clone() }), "retention");
        assert_eq!(field(StorePolicy { premake_days: 0, ..base.clone() }), "premake_days");
        assert_eq!(field(StorePolicy { max_session_lifetime: Duration::ZERO, ..base.clone() }), "max_session_lifetime");
        assert_eq!(field(StorePolicy { default_ttl: Some(Duration::ZERO), ..base }), "default_ttl");
    }

    #[test]
    fn a_client_can_only_tighten() {
        let policy = StorePolicy { default_ttl: Some(DAY), ..StorePolicy::default() };
        assert_eq!(policy.effective_lifetime(None), DAY * 7);
        assert_eq!(policy.effective_lifetime(Some(DAY * 70)), DAY * 7);
        assert_eq!(policy.effective_lifetime(Some(DAY)), DAY);
        assert_eq!(policy.effective_ttl(Some(DAY * 2)), Some(DAY));
        assert_eq!(policy.effective_ttl(Some(Duration::from_secs(60))), Some(Duration::from_secs(60)));
        assert_eq!(StorePolicy::default().effective_ttl(None), None);
    }
}
