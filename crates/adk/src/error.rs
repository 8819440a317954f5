//! Store errors as adk errors. adk-core has no "conflict" category, so each
//! store error goes to the category whose HTTP status and retry hint fit what
//! the caller should do next: fix the request (invalid input), reload and
//! retry (unavailable/timeout, retryable), or escalate (internal). The code
//! says precisely what happened, and `details.metadata` carries the fields a
//! program needs (`store_error`, `field`, `successor`, …).

use adk_core::{AdkError, ErrorCategory, ErrorComponent, ErrorDetails, RetryHint};
use adk_postgres_domain::StoreError;
use serde_json::Value;

/// The error codes this crate produces, all of component `session`.
pub mod codes {
    /// No such session for this app and user (or it expired). Category
    /// `NotFound`; the code adk-session's own backends use.
    pub const NOT_FOUND: &str = "session.not_found";
    /// An app name, user id or session id is empty, too long or holds NUL.
    pub const INVALID_IDENTITY: &str = "session.invalid_identity";
    /// A state key adk-core or the store refuses (`validate_state_key`).
    pub const INVALID_STATE_KEY: &str = "session.invalid_state_key";
    /// Any other malformed input (event fields, NUL in values, page tokens…).
    pub const INVALID_INPUT: &str = "session.invalid_input";
    /// A scope's state would pass the 64 KiB cap; nothing was written.
    pub const STATE_TOO_LARGE: &str = "session.state_too_large";
    /// An event over the 1 MiB cap; nothing was written.
    pub const EVENT_TOO_LARGE: &str = "session.event_too_large";
    /// `create` with a session id that is taken; the existing session is
    /// untouched (adk's in-memory service would overwrite it).
    pub const ALREADY_EXISTS: &str = "session.already_exists";
    /// An event id reused with different content. (The same id with the
    /// same content is a retry and succeeds.)
    pub const DUPLICATE_EVENT: &str = "session.duplicate_event";
    /// Someone appended since the caller loaded the session.
    pub const STALE: &str = "session.stale";
    /// Another invocation is running on the session (it holds the
    /// session's invocation lease); nothing was written. Category
    /// `Unavailable`, retryable: `details.metadata` names the `holder` and
    /// when its lease lapses at the latest (`lapses_at`).
    pub const BUSY: &str = "session.busy";
    /// This invocation was taken over: another one took the session's lease
    /// after this one's lapsed. Not retryable; the turn is over.
    pub const LEASE_LOST: &str = "session.lease_lost";
    /// The session was rolled over; `details.metadata.successor` names its
    /// successor.
    pub const CLOSED: &str = "session.closed";
    /// The session passed the maximum session lifetime; roll it over.
    pub const LIFETIME_EXCEEDED: &str = "session.lifetime_exceeded";
    /// A bare session id (legacy `append_event`, `rewind`) matches sessions
    /// of several users or apps; use the `*_for_identity` methods.
    pub const AMBIGUOUS_ID: &str = "session.ambiguous_id";
    /// `rewind` or `redact_event` to an event id the session does not hold.
    pub const EVENT_NOT_FOUND: &str = "session.event_not_found";
    /// `rewind_steps` past the first event.
    pub const REWIND_OUT_OF_RANGE: &str = "session.rewind_out_of_range";
    /// No event partition for the session's day: partition maintenance has
    /// not run (`adk-pg maintain`). Category `Unavailable`.
    pub const PARTITION_MISSING: &str = "session.partition_missing";
    /// Too many callers queued for a database connection. Category
    /// `Unavailable`, retryable.
    pub const OVERLOADED: &str = "session.overloaded";
    /// A lock or statement timeout; retryable.
    pub const TIMEOUT: &str = "session.timeout";
    /// A serialization failure or deadlock; retryable.
    pub const CONFLICT: &str = "session.conflict";
    /// The database refused access (row-level security, privileges).
    pub const FORBIDDEN: &str = "session.forbidden";
    /// No connection, or the server went away; retryable.
    pub const UNAVAILABLE: &str = "session.unavailable";
    /// Anything else the database reported.
    pub const DATABASE: &str = "session.database";
    /// A stored event that is not a readable adk event.
    pub const CORRUPT_EVENT: &str = "session.corrupt_event";
    /// Applying the store's migrations failed.
    pub const MIGRATION_FAILED: &str = "session.migration_failed";
}

/// The adk error for a store error: component `session`, the code from
/// [`codes`], the closest category, and the store error as its source.
pub fn to_adk_error(error: StoreError) -> AdkError {
    let (category, code, kind) = classify(&error);
    let mut metadata = std::collections::HashMap::new();
    metadata.insert("store_error".to_owned(), Value::from(kind));
    match &error {
        StoreError::InvalidInput { field, .. } | StoreError::StateTooLarge { field, .. } => {
            metadata.insert("field".to_owned(), Value::from(field.as_str()));
        }
        StoreError::SessionClosed { successor: Some(successor), .. } => {
            metadata.insert("successor".to_owned(), Value::from(successor.as_str()));
        }
        StoreError::EventNotFound { event_id, .. } => {
            metadata.insert("field".to_owned(), Value::from("event_id"));
            metadata.insert("event_id".to_owned(), Value::from(event_id.as_str()));
        }
        StoreError::SessionBusy { holder, lapses_at, .. } => {
            metadata.insert("holder".to_owned(), Value::from(holder.as_str()));
            metadata.insert("lapses_at".to_owned(), Value::from(lapses_at.to_rfc3339()));
        }
        StoreError::PartitionMissing { day: Some(day) } => {
            metadata.insert("day".to_owned(), Value::from(day.to_string()));
        }
        _ => {}
    }
    let message = match &error {
        // Worded like adk-session's own not-found errors.
        StoreError::NotFound(key) => {
            format!("session '{}' was not found for app '{}' and user '{}'", key.session_id, key.app_name, key.user_id)
        }
        other => other.to_string(),
    };
    // A busy session is usually free again when the holder's turn ends,
    // long before its lease would lapse: a second, or less when it lapses
    // sooner.
    let retry = match &error {
        StoreError::SessionBusy { lapses_at, .. } => {
            let until_lapse = (*lapses_at - chrono::Utc::now()).to_std().unwrap_or_default();
            Some(RetryHint::for_category(category).with_retry_after(until_lapse.min(std::time::Duration::from_secs(1))))
        }
        _ => None,
    };
    let adk = AdkError::new(ErrorComponent::Session, category, code, message)
        .with_details(ErrorDetails { metadata, ..ErrorDetails::default() });
    match retry {
        Some(retry) => adk.with_retry(retry),
        None => adk,
    }
    .with_source(error)
}

fn classify(error: &StoreError) -> (ErrorCategory, &'static str, &'static str) {
    use ErrorCategory as C;
    match error {
        StoreError::InvalidInput { field, reason } => {
            let code = match field.as_str() {
                "app_name" | "user_id" | "session_id" => codes::INVALID_IDENTITY,
                // The store names a bad state key as `<field>["key"]` with a
                // reason about the key (a NUL in the value has the same field).
                f if f.ends_with("\"]") && (reason.contains("state key") || reason.contains("scope prefix")) => {
                    codes::INVALID_STATE_KEY
                }
                _ => codes::INVALID_INPUT,
            };
            (C::InvalidInput, code, "invalid_input")
        }
        StoreError::StateTooLarge { .. } => (C::InvalidInput, codes::STATE_TOO_LARGE, "state_too_large"),
        StoreError::EventTooLarge { .. } => (C::InvalidInput, codes::EVENT_TOO_LARGE, "event_too_large"),
        StoreError::NotFound(_) => (C::NotFound, codes::NOT_FOUND, "not_found"),
        StoreError::EventNotFound { .. } => (C::NotFound, codes::EVENT_NOT_FOUND, "event_not_found"),
        StoreError::AlreadyExists(_) => (C::InvalidInput, codes::ALREADY_EXISTS, "already_exists"),
        StoreError::DuplicateEvent { .. } => (C::InvalidInput, codes::DUPLICATE_EVENT, "duplicate_event"),
        // Not retryable as is: the caller must reload the session first.
        StoreError::StaleSession { .. } => (C::InvalidInput, codes::STALE, "stale_session"),
        StoreError::SessionBusy { .. } => (C::Unavailable, codes::BUSY, "session_busy"),
        StoreError::LeaseLost { .. } => (C::InvalidInput, codes::LEASE_LOST, "lease_lost"),
        StoreError::SessionClosed { .. } => (C::InvalidInput, codes::CLOSED, "session_closed"),
        StoreError::LifetimeExceeded { .. } => (C::InvalidInput, codes::LIFETIME_EXCEEDED, "lifetime_exceeded"),
        StoreError::PartitionMissing { .. } => (C::Unavailable, codes::PARTITION_MISSING, "partition_missing"),
        StoreError::Timeout { .. } => (C::Timeout, codes::TIMEOUT, "timeout"),
        StoreError::Conflict { .. } => (C::Unavailable, codes::CONFLICT, "conflict"),
        StoreError::PermissionDenied { .. } => (C::Forbidden, codes::FORBIDDEN, "permission_denied"),
        StoreError::Unavailable { .. } => (C::Unavailable, codes::UNAVAILABLE, "unavailable"),
        StoreError::Overloaded { .. } => (C::Unavailable, codes::OVERLOADED, "overloaded"),
        StoreError::Database { .. } => (C::Internal, codes::DATABASE, "database"),
        // StoreError is non-exhaustive: a variant added later is reported,
        // not hidden, until it gets a mapping of its own.
        _ => (C::Internal, codes::DATABASE, "other"),
    }
}

/// An invalid-input error of component `session`.
pub(crate) fn invalid(code: &'static str, message: impl Into<String>) -> AdkError {
    AdkError::new(ErrorComponent::Session, ErrorCategory::InvalidInput, code, message)
}

/// A not-found error of component `session` with code `code`.
pub(crate) fn not_found(code: &'static str, message: impl Into<String>) -> AdkError {
    AdkError::not_found(ErrorComponent::Session, code, message)
}

#[cfg(test)]
mod tests {
    use adk_postgres_domain::{SessionKey, StoreError};

    use super::*;

    fn key() -> SessionKey {
        SessionKey::parse("a", "u", "s").unwrap()
    }

    #[test]
    fn categories_and_codes() {
        let cases = [
            (StoreError::NotFound(key()), ErrorCategory::NotFound, codes::NOT_FOUND, false),
            (
                StoreError::invalid("user_id", "must not be empty"),
                ErrorCategory::InvalidInput,
                codes::INVALID_IDENTITY,
                false,
            ),
            (
                StoreError::invalid("state[\"a\"]", "a state key must not contain control characters"),
                ErrorCategory::InvalidInput,
                codes::INVALID_STATE_KEY,
                false,
            ),
            (StoreError::invalid("event.author", "x"), ErrorCategory::InvalidInput, codes::INVALID_INPUT, false),
            (StoreError::AlreadyExists(key()), ErrorCategory::InvalidInput, codes::ALREADY_EXISTS, false),
            (
                StoreError::DuplicateEvent { key: key(), event_id: "e".into() },
                ErrorCategory::InvalidInput,
                codes::DUPLICATE_EVENT,
                false,
            ),
            (StoreError::Timeout { what: "lock".into() }, ErrorCategory::Timeout, codes::TIMEOUT, true),
            (StoreError::Conflict { message: "x".into() }, ErrorCategory::Unavailable, codes::CONFLICT, true),
            (StoreError::Unavailable { message: "x".into() }, ErrorCategory::Unavailable, codes::UNAVAILABLE, true),
            (StoreError::Database { message: "x".into() }, ErrorCategory::Internal, codes::DATABASE, false),
            (
                StoreError::SessionBusy { key: key(), holder: "inv".into(), lapses_at: chrono::Utc::now() },
                ErrorCategory::Unavailable,
                codes::BUSY,
                true,
            ),
            (
                StoreError::LeaseLost { key: key(), held: 1, current: 2 },
                ErrorCategory::InvalidInput,
                codes::LEASE_LOST,
                false,
            ),
        ];
        for (store_error, category, code, retry) in cases {
            let err = to_adk_error(store_error.clone());
            assert_eq!(
                (err.component, err.category, err.code),
                (ErrorComponent::Session, category, code),
                "{store_error}"
            );
            assert_eq!(err.is_retryable(), retry, "{store_error}");
            if !matches!(store_error, StoreError::NotFound(_)) {
                assert_eq!(err.message, store_error.to_string());
            }
        }
    }

    #[test]
    fn not_found_reads_like_adk_session() {
        let err = to_adk_error(StoreError::NotFound(key()));
        assert_eq!(err.message, "session 's' was not found for app 'a' and user 'u'");
    }

    #[test]
    fn closed_sessions_name_their_successor() {
        let successor = adk_postgres_domain::SessionId::new("next").unwrap();
        let err = to_adk_error(StoreError::SessionClosed { key: key(), successor: Some(successor) });
        assert_eq!(err.code, codes::CLOSED);
        assert_eq!(err.details.metadata["successor"], "next");
    }
}
