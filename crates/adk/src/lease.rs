//! The adapter's side of the invocation lease (`adk_postgres_domain::lease`):
//! which appends end a turn, and the fencing tokens of the invocations this
//! service is running.
//!
//! adk's `append_event` carries no token, so the service keeps each
//! running invocation's generation itself, keyed by session and invocation
//! id, and sends it with the invocation's next append. A token outlives a
//! released lease by one idle lapse: an invocation whose agents answer one
//! after another (a `SequentialAgent`) releases at each final response and
//! takes the lease back with the next agent's event, and the token is what
//! tells that it was not taken over in between.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use adk_postgres_domain::{InvocationLease, LeaseGrant, SessionKey};
use adk_session::Event;

/// Past this many remembered tokens, an insert first forgets the expired.
const SWEEP_AT: usize = 1024;

/// Whether `event` ends its invocation's turn: adk-core's own notion of a
/// final response (no pending function call or response, not partial; a
/// long-running tool's call or `skip_summarization` counts as final), from
/// an agent. The user's message that opens a turn is "final" to adk-core
/// too, but it is the turn's first event, not its last.
pub(crate) fn ends_turn(event: &Event) -> bool {
    event.author != "user" && event.is_final_response()
}

#[derive(Debug, Clone, Copy)]
struct Held {
    generation: u64,
    forget_at: Instant,
}

/// The tokens of the invocations this service (and its clones) append for.
#[derive(Debug, Clone, Default)]
pub(crate) struct LeaseBook {
    held: Arc<Mutex<HashMap<(SessionKey, String), Held>>>,
}

impl LeaseBook {
    /// The lease request for the next append of `invocation_id`.
    pub(crate) fn request(
        &self,
        key: &SessionKey,
        invocation_id: &str,
        idle: Duration,
        release: bool,
    ) -> InvocationLease {
        let generation = self.lock().get(&(key.clone(), invocation_id.to_owned())).map(|held| held.generation);
        InvocationLease { idle, generation, release }
    }

    /// Remembers what the store granted.
    pub(crate) fn granted(&self, key: &SessionKey, invocation_id: &str, idle: Duration, grant: LeaseGrant) {
        let now = Instant::now();
        let mut held = self.lock();
        if held.len() >= SWEEP_AT {
            held.retain(|_, h| h.forget_at > now);
        }
        held.insert(
            (key.clone(), invocation_id.to_owned()),
            Held { generation: grant.generation, forget_at: now + idle },
        );
    }

    /// Forgets an invocation that lost its lease: its turn is over.
    pub(crate) fn forget(&self, key: &SessionKey, invocation_id: &str) {
        self.lock().remove(&(key.clone(), invocation_id.to_owned()));
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<(SessionKey, String), Held>> {
        // A panic while holding the map cannot leave it half-changed (each
        // critical section is one map call), so a poisoned lock is usable.
        self.held.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}
