//! The errors of the session store contract. Every variant names what went
//! wrong precisely enough for a caller to act: fix a field, retry, roll a
//! session over, or run maintenance.

use std::time::Duration;

use chrono::{DateTime, NaiveDate, Utc};

use crate::ids::{SessionId, SessionKey};

/// Why a session store operation failed.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    /// Bad input; nothing was written.
    #[error("invalid {field}: {reason}")]
    InvalidInput {
        /// The input at fault, such as `session_id` or `page_token`.
        field: String,
        /// What is wrong with it.
        reason: String,
    },
    /// A scope's state would exceed the size cap; nothing was written.
    #[error("{field} is too large{}: the limit is {limit} bytes", size.map(|s| format!(" ({s} bytes)")).unwrap_or_default())]
    StateTooLarge {
        /// The input and scope, such as `state (user scope)`.
        field: String,
        /// The scope's size in bytes of JSON; `None` when the database
        /// refused it and did not say.
        size: Option<usize>,
        /// The cap in bytes.
        limit: usize,
    },
    /// An event over the size cap; nothing was written.
    #[error("event is {size} bytes, over the limit of {limit}")]
    EventTooLarge {
        /// The event's size in bytes.
        size: usize,
        /// The cap in bytes.
        limit: usize,
    },
    /// No such session for this app and user, or it has expired.
    #[error("session {0} not found")]
    NotFound(SessionKey),
    /// The session exists but holds no event with this id (`event_id`).
    #[error("session {key} has no event with event_id {event_id:?}")]
    EventNotFound {
        /// The session.
        key: SessionKey,
        /// The id looked for.
        event_id: String,
    },
    /// A create with an id that is taken; the existing session is untouched.
    #[error("session {0} already exists")]
    AlreadyExists(SessionKey),
    /// An event id reused with different content.
    #[error("event {event_id} already exists in session {key} with different content")]
    DuplicateEvent {
        /// The session.
        key: SessionKey,
        /// The reused id.
        event_id: String,
    },
    /// Someone appended since the caller loaded the session; nothing was written.
    #[error("session {key} is at version {actual}, not the expected {expected}")]
    StaleSession {
        /// The session.
        key: SessionKey,
        /// The version (event count) the caller loaded.
        expected: u64,
        /// The version the session is at now.
        actual: u64,
    },
    /// Another invocation holds the session's lease (see [`crate::lease`]);
    /// nothing was written. Retry once the holder's turn ended, at the latest
    /// at `lapses_at`.
    #[error("session {key} is busy: invocation {holder:?} holds it until {lapses_at} at the latest")]
    SessionBusy {
        /// The session.
        key: SessionKey,
        /// The invocation id holding the lease.
        holder: String,
        /// When the lease lapses unless its holder appends again.
        lapses_at: DateTime<Utc>,
    },
    /// This invocation's lease (generation `held`) was taken over by another
    /// invocation since its last append; nothing was written. The turn must
    /// be abandoned: its events would land among the other's.
    #[error("the invocation lost its lease on session {key}: it held generation {held}, the session is at {current}")]
    LeaseLost {
        /// The session.
        key: SessionKey,
        /// The lease generation this invocation held.
        held: u64,
        /// The session's generation now, another invocation's.
        current: u64,
    },
    /// The session was rolled over; appends go to its successor.
    #[error("session {key} is closed{}", successor.as_ref().map(|s| format!("; its successor is {s}")).unwrap_or_default())]
    SessionClosed {
        /// The session.
        key: SessionKey,
        /// The session it was rolled over to, when the store could name it.
        successor: Option<SessionId>,
    },
    /// The session is older than the maximum lifetime; roll it over.
    #[error("session {key} is older than the maximum session lifetime of {max_lifetime:?}; roll it over")]
    LifetimeExceeded {
        /// The session.
        key: SessionKey,
        /// The policy's maximum session lifetime.
        max_lifetime: Duration,
    },
    /// The event partition for the session's day does not exist and the
    /// store could not make it (the day is not one the policy premakes, or
    /// the role may not run `adk_premake_event_partitions`). Loud on purpose;
    /// there is no fallback. `day` is `None` when the server withheld it:
    /// PostgreSQL names the failing row's key only to a role that may read
    /// the table directly.
    #[error(
        "no event partition exists for session day {}; run partition maintenance (adk-pg maintain)",
        day.map_or_else(|| "(not disclosed to this role)".to_owned(), |d| d.to_string())
    )]
    PartitionMissing {
        /// The session's day (UTC), when the server disclosed it.
        day: Option<NaiveDate>,
    },
    /// A server-side statement or lock timeout fired; nothing was written.
    #[error("timed out waiting for {what}")]
    Timeout {
        /// What was waited for: a lock or the statement.
        what: String,
    },
    /// The statement lost a deadlock or serialization race and was rolled
    /// back; the store already retried it a bounded number of times.
    #[error("conflicting concurrent transaction, retry: {message}")]
    Conflict {
        /// The server's message.
        message: String,
    },
    /// Row-level security or a missing grant refused the statement.
    #[error("permission denied: {message}")]
    PermissionDenied {
        /// The server's message.
        message: String,
    },
    /// The database could not be reached or dropped the connection; safe to
    /// retry (appends are idempotent by event id).
    #[error("database unavailable, retry: {message}")]
    Unavailable {
        /// The server's or the driver's message.
        message: String,
    },
    /// More callers were queued for a database connection than the store
    /// admits, or one waited longer than the pool's checkout timeout behind
    /// them; nothing was sent. Safe to retry, best after a pause.
    #[error("the store is overloaded: {waiting} callers were waiting for a connection, this one for {waited:?}")]
    Overloaded {
        /// Callers queued for a connection when this one gave up.
        waiting: usize,
        /// How long this caller waited.
        waited: Duration,
    },
    /// Anything else the database reported.
    #[error("database error: {message}")]
    Database {
        /// The server's message.
        message: String,
    },
}

impl StoreError {
    /// One fixed word per variant (`not_found`, `stale_session`, …), for
    /// logs, span fields and metric labels. The match is exhaustive here,
    /// where the enum is defined, so a new variant cannot ship without one.
    pub fn kind(&self) -> &'static str {
        match self {
            StoreError::InvalidInput { .. } => "invalid_input",
            StoreError::StateTooLarge { .. } => "state_too_large",
            StoreError::EventTooLarge { .. } => "event_too_large",
            StoreError::NotFound(_) => "not_found",
            StoreError::EventNotFound { .. } => "event_not_found",
            StoreError::AlreadyExists(_) => "already_exists",
            StoreError::DuplicateEvent { .. } => "duplicate_event",
            StoreError::StaleSession { .. } => "stale_session",
            StoreError::SessionBusy { .. } => "session_busy",
            StoreError::LeaseLost { .. } => "lease_lost",
            StoreError::SessionClosed { .. } => "session_closed",
            StoreError::LifetimeExceeded { .. } => "lifetime_exceeded",
            StoreError::PartitionMissing { .. } => "partition_missing",
            StoreError::Timeout { .. } => "timeout",
            StoreError::Conflict { .. } => "conflict",
            StoreError::PermissionDenied { .. } => "permission_denied",
            StoreError::Unavailable { .. } => "unavailable",
            StoreError::Overloaded { .. } => "overloaded",
            StoreError::Database { .. } => "database",
        }
    }

    /// An [`StoreError::InvalidInput`] naming the field and what is wrong.
    pub fn invalid(field: impl Into<String>, reason: impl Into<String>) -> Self {
        Self::InvalidInput { field: field.into(), reason: reason.into() }
    }

    /// Whether retrying the same call may succeed.
    pub fn is_retryable(&self) -> bool {
        matches!(
            self,
            Self::Unavailable { .. }
                | Self::Timeout { .. }
                | Self::Conflict { .. }
                | Self::Overloaded { .. }
                | Self::SessionBusy { .. }
        )
    }
}
