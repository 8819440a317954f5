//! The one place database failures become domain errors.
//!
//! diesel keeps the SQLSTATE only for constraint classes; lock and statement
//! timeouts, deadlocks and shutdowns arrive as `Unknown`, so they are told
//! apart by PostgreSQL's message text (the server's `lc_messages` must stay
//! English for that; anything unrecognised is still a typed `Database`
//! error, never a panic).

use adk_postgres_domain::StoreError;
use adk_postgres_domain::state::MAX_STATE_BYTES;
use chrono::NaiveDate;
use diesel::result::{DatabaseErrorKind, Error as DieselError};
use diesel_async::pooled_connection::bb8::RunError;

/// Maps a pool checkout failure.
pub(crate) fn from_pool(error: RunError) -> StoreError {
    StoreError::Unavailable { message: format!("no database connection: {error}") }
}

/// Maps a query failure. `state_field` names the input whose state a size
/// check refers to (`state` on create, the event's state delta on append).
pub(crate) fn from_diesel(error: DieselError, state_field: &str) -> StoreError {
    match error {
        DieselError::DatabaseError(kind, info) => {
            let message = info.message();
            let constraint = info.constraint_name().unwrap_or_default();
            match kind {
                DatabaseErrorKind::CheckViolation if message.starts_with("no partition of relation") => {
                    StoreError::PartitionMissing { day: info.details().and_then(partition_day) }
                }
                DatabaseErrorKind::CheckViolation if constraint.ends_with("_state_size") => StoreError::StateTooLarge {
                    field: format!("{state_field} ({} scope)", scope_of(constraint)),
                    size: None,
                    limit: MAX_STATE_BYTES,
                },
                DatabaseErrorKind::CheckViolation | DatabaseErrorKind::NotNullViolation => {
                    StoreError::invalid(constraint_field(constraint), message)
                }
                DatabaseErrorKind::SerializationFailure => StoreError::Conflict { message: message.to_owned() },
                DatabaseErrorKind::UnableToSendCommand => StoreError::Unavailable { message: message.to_owned() },
                _ if message.starts_with("deadlock detected") => StoreError::Conflict { message: message.to_owned() },
                _ if message.contains("row-level security") || message.starts_with("permission denied") => {
                    StoreError::PermissionDenied { message: message.to_owned() }
                }
                _ if message.contains("lock timeout") => StoreError::Timeout { what: "a lock (lock_timeout)".into() },
                _ if message.contains("statement timeout") => {
                    StoreError::Timeout { what: "the statement (statement_timeout)".into() }
                }
                _ if message.starts_with("terminating connection") || message.contains("the database system is") => {
                    StoreError::Unavailable { message: message.to_owned() }
                }
                _ => StoreError::Database { message: message.to_owned() },
            }
        }
        DieselError::BrokenTransactionManager => {
            StoreError::Unavailable { message: "connection left in an unknown transaction state".into() }
        }
        other => StoreError::Database { message: other.to_string() },
    }
}

/// `Partition key of the failing row contains (session_day) = (2026-11-30).`
fn partition_day(detail: &str) -> Option<NaiveDate> {
    let start = detail.rfind("= (")? + 3;
    let end = start + detail[start..].find(')')?;
    NaiveDate::parse_from_str(&detail[start..end], "%Y-%m-%d").ok()
}

fn scope_of(constraint: &str) -> &'static str {
    if constraint.starts_with("adk_user_states") {
        "user"
    } else if constraint.starts_with("adk_app_states") {
        "app"
    } else {
        "session"
    }
}

/// `adk_sessions_session_id_sane` → `session_id`.
fn constraint_field(constraint: &str) -> String {
    let rest = ["adk_sessions_", "adk_user_states_", "adk_app_states_", "adk_events_"]
        .iter()
        .find_map(|p| constraint.strip_prefix(p))
        .unwrap_or(constraint);
    rest.strip_suffix("_sane").or_else(|| rest.strip_suffix("_is_object")).unwrap_or(rest).to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_day_from_the_partition_error_detail() {
        let day = partition_day("Partition key of the failing row contains (session_day) = (2026-11-30).");
        assert_eq!(day, NaiveDate::from_ymd_opt(2026, 11, 30));
        assert_eq!(partition_day("something else"), None);
    }

    #[test]
    fn names_fields_from_constraints() {
        assert_eq!(constraint_field("adk_sessions_session_id_sane"), "session_id");
        assert_eq!(constraint_field("adk_sessions_state_is_object"), "state");
        assert_eq!(scope_of("adk_user_states_state_size"), "user");
    }
}
