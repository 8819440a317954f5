//! The store's policy: how long a session may live, how long its events are
//! kept after that, the default time to live and how many days of event
//! partitions exist ahead of today.
//!
//! The policy lives in the database (`adk_store_policy`, one row), where the
//! SQL functions and maintenance both read it; this type is its Rust face.
//! A client's `StoreConfig` may only tighten it: the shorter of the two
//! lifetimes and TTLs wins. A day counts as 24 hours and a month as 30 days,
//! whatever the server's TimeZone.

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
