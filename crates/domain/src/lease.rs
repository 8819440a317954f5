//! One invocation at a time per session: the invocation lease.
//!
//! Two runners appending to one session at once interleave their events
//! (one's user message lands between the other's tool call and its answer)
//! unless something stops the second. The first append of an invocation
//! takes the session's lease; while it lives, appends of any other
//! invocation are refused with [`StoreError::SessionBusy`]. The lease ends
//! when the holder appends with [`InvocationLease::release`] (the adk
//! adapter sets it on the invocation's final response), or when no append
//! of the holder came for [`InvocationLease::idle`], so a runner that died
//! mid-turn blocks the session for that long at most.
//!
//! Every lease taken gets the next generation of the session: a fencing
//! token. A holder passes the generation of its previous append back with
//! the next one; once another invocation has taken the session over, the
//! generation has moved on and the late holder's append is refused
//! ([`StoreError::SessionBusy`] while the new holder is live,
//! [`StoreError::LeaseLost`] after), never stored between the new holder's
//! events.
//!
//! [`LeaseState::admit`] is the rule, stated once for the in-memory store;
//! the PostgreSQL store states it in the append's SQL
//! (`crates/schema/sql/append.sql`), and the conformance suite holds both
//! to the same outcomes.

use std::time::Duration;

use chrono::{DateTime, TimeDelta, Utc};

use crate::error::StoreError;
use crate::ids::SessionKey;

/// How long a lease outlives its holder's last append when the adk adapter
/// does not say otherwise: longer than a slow model call or tool between two
/// appends of one turn, short enough that a session whose runner died is
/// free again within two minutes. A tool that runs longer is a long-running
/// tool in adk terms, and its call ends the turn (and the lease).
pub const DEFAULT_LEASE_IDLE: Duration = Duration::from_secs(120);

/// The longest idle lapse the store accepts: a day. Longer would let a dead
/// runner hold a session for days.
pub const MAX_LEASE_IDLE: Duration = Duration::from_secs(24 * 60 * 60);

/// An append's part in the lease (`AppendOptions::lease`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct InvocationLease {
    /// How long the lease lives after this append without another one of
    /// the same invocation. At least a millisecond, at most
    /// [`MAX_LEASE_IDLE`].
    pub idle: Duration,
    /// The generation this invocation's previous append returned
    /// (`Appended::lease`); `None` on its first append.
    pub generation: Option<u64>,
    /// This event ends the invocation's turn: the lease is released with it.
    pub release: bool,
}

impl InvocationLease {
    /// The first append of an invocation: take the lease.
    pub fn take(idle: Duration) -> Self {
        Self { idle, generation: None, release: false }
    }

    /// Checks the idle lapse, and that the event names its invocation: a
    /// lease is held by an invocation id, so an event without one cannot
    /// take part.
    pub fn validate(&self, invocation_id: &str) -> Result<(), StoreError> {
        if self.idle < Duration::from_millis(1) || self.idle > MAX_LEASE_IDLE {
            return Err(StoreError::invalid("lease.idle", "must be between 1 ms and 24 hours"));
        }
        if invocation_id.is_empty() {
            return Err(StoreError::invalid(
                "event.invocation_id",
                "an append under an invocation lease must name its invocation",
            ));
        }
        if self.generation.is_some_and(|g| i64::try_from(g).is_err()) {
            return Err(StoreError::invalid("lease.generation", "out of range"));
        }
        Ok(())
    }
}

/// The lease an append took or kept (`Appended::lease`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LeaseGrant {
    /// The fencing token: pass it back with the invocation's next append.
    pub generation: u64,
    /// When the lease lapses without another append; `None` once released.
    pub expires_at: Option<DateTime<Utc>>,
}

/// A session's lease as the store keeps it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LeaseState {
    /// The invocation holding it; `None` when never taken or released.
    pub holder: Option<String>,
    /// Bumped each time another invocation takes the lease.
    pub generation: u64,
    /// When it lapses; meaningful only with a holder.
    pub until: Option<DateTime<Utc>>,
}

impl LeaseState {
    /// Whether another invocation may append now: the holder's, while the
    /// lease lives.
    fn held_by_other(&self, invocation_id: &str, now: DateTime<Utc>) -> Option<(&str, DateTime<Utc>)> {
        match (&self.holder, self.until) {
            (Some(holder), Some(until)) if until > now && holder != invocation_id => Some((holder, until)),
            _ => None,
        }
    }

    /// The lease after an append of `invocation_id` at `now`, or why the
    /// append is refused. The same rule as `adk_append_event`'s.
    pub fn admit(
        &self,
        key: &SessionKey,
        invocation_id: &str,
        request: &InvocationLease,
        now: DateTime<Utc>,
    ) -> Result<LeaseState, StoreError> {
        if let Some((holder, until)) = self.held_by_other(invocation_id, now) {
            return Err(StoreError::SessionBusy { key: key.clone(), holder: holder.to_owned(), lapses_at: until });
        }
        let generation = match request.generation {
            Some(held) if held != self.generation => {
                return Err(StoreError::LeaseLost { key: key.clone(), held, current: self.generation });
            }
            Some(_) => self.generation,
            None if self.holder.as_deref() == Some(invocation_id) => self.generation,
            None => self.generation + 1,
        };
        let idle = TimeDelta::from_std(request.idle).unwrap_or(TimeDelta::MAX);
        Ok(if request.release {
            LeaseState { holder: None, generation, until: None }
        } else {
            LeaseState { holder: Some(invocation_id.to_owned()), generation, until: now.checked_add_signed(idle) }
        })
    }

    /// What the caller is told of this lease.
    pub fn grant(&self) -> LeaseGrant {
        LeaseGrant { generation: self.generation, expires_at: self.holder.as_ref().and(self.until) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key() -> SessionKey {
        SessionKey::parse("a", "u", "s").expect("key")
    }

    fn at(seconds: i64) -> DateTime<Utc> {
        DateTime::from_timestamp(1_800_000_000 + seconds, 0).expect("time")
    }

    #[test]
    fn a_second_invocation_waits_for_release_or_lapse() {
        let idle = Duration::from_secs(10);
        let a = LeaseState::default().admit(&key(), "inv-a", &InvocationLease::take(idle), at(0)).expect("free");
        assert_eq!((a.holder.as_deref(), a.generation), (Some("inv-a"), 1));
        let busy = a.admit(&key(), "inv-b", &InvocationLease::take(idle), at(5));
        assert!(
            matches!(busy, Err(StoreError::SessionBusy { ref holder, lapses_at, .. }) if holder == "inv-a" && lapses_at == at(10))
        );
        let b = a.admit(&key(), "inv-b", &InvocationLease::take(idle), at(10)).expect("lapsed");
        assert_eq!(b.generation, 2);
        let late = InvocationLease { generation: Some(1), ..InvocationLease::take(idle) };
        assert!(matches!(a.admit(&key(), "inv-a", &late, at(5)), Ok(ref s) if s.generation == 1));
        assert!(matches!(b.admit(&key(), "inv-a", &late, at(11)), Err(StoreError::SessionBusy { .. })));
        let released = b
            .admit(&key(), "inv-b", &InvocationLease { generation: Some(2), release: true, idle }, at(12))
            .expect("holder");
        assert_eq!(released.grant(), LeaseGrant { generation: 2, expires_at: None });
        assert!(matches!(
            released.admit(&key(), "inv-a", &late, at(13)),
            Err(StoreError::LeaseLost { held: 1, current: 2, .. })
        ));
    }

    #[test]
    fn bad_requests_are_named() {
        let lease = InvocationLease::take(Duration::ZERO);
        assert!(matches!(lease.validate("i"), Err(StoreError::InvalidInput { field, .. }) if field == "lease.idle"));
        let lease = InvocationLease::take(DEFAULT_LEASE_IDLE);
        assert!(
            matches!(lease.validate(""), Err(StoreError::InvalidInput { field, .. }) if field == "event.invocation_id")
        );
        assert!(lease.validate("i").is_ok());
    }
}
