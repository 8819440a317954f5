//! The one place a PostgreSQL failure is told apart, for the store and the
//! operations crate alike.
//!
//! diesel keeps the SQLSTATE only for constraint classes and serialization
//! failures; lock and statement timeouts, deadlocks, permission errors and
//! shutdowns arrive as `Unknown` with the server's message, so those are
//! recognised by PostgreSQL's (English) message text. The server's
//! `lc_messages` must stay English for that; anything not recognised is
//! [`PgFailure::Other`], never a panic.

use chrono::NaiveDate;
use diesel::result::{DatabaseErrorKind, Error as DieselError};

/// What kind of failure a statement met.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum PgFailure {
    /// `lock_timeout` expired (55P03).
    LockTimeout,
    /// `statement_timeout` expired, or the statement was cancelled (57014).
    StatementTimeout,
    /// Chosen as the victim of a deadlock (40P01).
    Deadlock,
    /// Lost a serialization race (40001).
    SerializationFailure,
    /// Refused by a privilege check or a row-level security policy (42501).
    PermissionDenied,
    /// A row routed to a partition that does not exist; the day, when the
    /// server named it.
    PartitionMissing {
        /// The row's `session_day`; `None` when the server withheld it.
        day: Option<NaiveDate>,
    },
    /// A CHECK constraint (named) refused the row.
    CheckViolation {
        /// The constraint's name, such as `adk_sessions_session_id_sane`;
        /// empty when the server named none.
        constraint: String,
    },
    /// A NOT NULL constraint refused the row (23502).
    NotNullViolation {
        /// The constraint's name; empty when the server named none.
        constraint: String,
    },
    /// A unique constraint already holds the key (23505).
    UniqueViolation {
        /// The constraint's name; empty when the server named none.
        constraint: String,
    },
    /// The connection is gone or the server is shutting down or starting.
    ConnectionLost,
    /// The connection is in an unknown transaction state.
    BrokenConnection,
    /// Anything else.
    Other,
}

impl PgFailure {
    /// Worth running again after a short pause: the statement lost a race
    /// or a lock wait, and left nothing behind.
    pub fn is_transient_conflict(&self) -> bool {
        matches!(self, Self::LockTimeout | Self::Deadlock | Self::SerializationFailure)
    }
}

/// The name in PostgreSQL's `… violates … constraint "name"` message.
fn constraint_in_message(message: &str) -> Option<&str> {
    let (_, rest) = message.split_once(" constraint \"")?;
    rest.split_once('"').map(|(name, _)| name)
}

/// Classifies `error`.
pub fn classify(error: &DieselError) -> PgFailure {
    match error {
        DieselError::DatabaseError(kind, info) => {
            let message = info.message();
            // Citus relays a worker's error with its message but without the
            // constraint field, so the name is read from the message then.
            let constraint =
                || info.constraint_name().or_else(|| constraint_in_message(message)).unwrap_or_default().to_owned();
            match kind {
                DatabaseErrorKind::CheckViolation if message.starts_with("no partition of relation") => {
                    PgFailure::PartitionMissing { day: info.details().and_then(partition_day) }
                }
                DatabaseErrorKind::CheckViolation => PgFailure::CheckViolation { constraint: constraint() },
                DatabaseErrorKind::NotNullViolation => PgFailure::NotNullViolation { constraint: constraint() },
                DatabaseErrorKind::UniqueViolation => PgFailure::UniqueViolation { constraint: constraint() },
                DatabaseErrorKind::SerializationFailure => PgFailure::SerializationFailure,
                DatabaseErrorKind::UnableToSendCommand | DatabaseErrorKind::ClosedConnection => {
                    PgFailure::ConnectionLost
                }
                _ if message.starts_with("deadlock detected") => PgFailure::Deadlock,
                _ if message.contains("row-level security") || message.starts_with("permission denied") => {
                    PgFailure::PermissionDenied
                }
                _ if message.contains("lock timeout") => PgFailure::LockTimeout,
                _ if message.contains("statement timeout") || message.starts_with("canceling statement") => {
                    PgFailure::StatementTimeout
                }
                _ if message.starts_with("terminating connection") || message.contains("the database system is") => {
                    PgFailure::ConnectionLost
                }
                _ => PgFailure::Other,
            }
        }
        DieselError::BrokenTransactionManager => PgFailure::BrokenConnection,
        _ => PgFailure::Other,
    }
}

/// `Partition key of the failing row contains (session_day) = (2026-11-30).`
fn partition_day(detail: &str) -> Option<NaiveDate> {
    let start = detail.rfind("= (")? + 3;
    let end = start + detail[start..].find(')')?;
    NaiveDate::parse_from_str(&detail[start..end], "%Y-%m-%d").ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_constraint_from_a_relayed_message() {
        let message =
            r#"new row for relation "adk_sessions_102012" violates check constraint "adk_sessions_state_size""#;
        assert_eq!(constraint_in_message(message), Some("adk_sessions_state_size"));
        assert_eq!(constraint_in_message("null value in column \"x\""), None);
    }

    #[test]
    fn reads_the_day_from_the_partition_error_detail() {
        let day = partition_day("Partition key of the failing row contains (session_day) = (2026-11-30).");
        assert_eq!(day, NaiveDate::from_ymd_opt(2026, 11, 30));
        assert_eq!(partition_day("something else"), None);
    }

    fn unknown(message: &str) -> DieselError {
        DieselError::DatabaseError(DatabaseErrorKind::Unknown, Box::new(message.to_owned()))
    }

    #[test]
    fn tells_server_messages_apart() {
        assert_eq!(classify(&unknown("canceling statement due to lock timeout")), PgFailure::LockTimeout);
        assert_eq!(classify(&unknown("canceling statement due to statement timeout")), PgFailure::StatementTimeout);
        assert_eq!(classify(&unknown("deadlock detected")), PgFailure::Deadlock);
        assert_eq!(classify(&unknown("permission denied for app \"a\"")), PgFailure::PermissionDenied);
        assert_eq!(
            classify(&unknown("new row violates row-level security policy for table \"adk_sessions\"")),
            PgFailure::PermissionDenied
        );
        assert_eq!(
            classify(&unknown("terminating connection due to administrator command")),
            PgFailure::ConnectionLost
        );
        assert_eq!(classify(&unknown("the database system is shutting down")), PgFailure::ConnectionLost);
        assert_eq!(classify(&unknown("division by zero")), PgFailure::Other);
        assert!(classify(&unknown("deadlock detected")).is_transient_conflict());
    }
}
