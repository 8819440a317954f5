//! Database failures as domain errors; [`crate::pg_error`] tells them apart.

use crate::pool::CheckoutError;
use adk_postgres_domain::StoreError;
use adk_postgres_domain::state::MAX_STATE_BYTES;
use diesel::result::Error as DieselError;

use crate::pg_error::{PgFailure, classify};

/// Maps a pool checkout failure: a connection that could not be made is
/// retryable when its cause may pass (the network, the server, the
/// credentials source), and a configuration error otherwise.
pub(crate) fn from_pool(error: CheckoutError) -> StoreError {
    if error.is_retryable() {
        StoreError::Unavailable { message: error.to_string() }
    } else {
        StoreError::Database { message: format!("cannot connect: {error}") }
    }
}

/// Maps a query failure. `state_field` names the input whose state a size
/// check refers to (`state` on create, the event's state delta on append).
pub(crate) fn from_diesel(error: DieselError, state_field: &str) -> StoreError {
    let message = || match &error {
        DieselError::DatabaseError(_, info) => info.message().to_owned(),
        other => other.to_string(),
    };
    match classify(&error) {
        PgFailure::PartitionMissing { day } => StoreError::PartitionMissing { day },
        PgFailure::CheckViolation { constraint } if constraint.ends_with("_state_size") => StoreError::StateTooLarge {
            field: format!("{state_field} ({} scope)", scope_of(&constraint)),
            size: None,
            limit: MAX_STATE_BYTES,
        },
        PgFailure::CheckViolation { constraint } | PgFailure::NotNullViolation { constraint } => {
            StoreError::invalid(constraint_field(&constraint), message())
        }
        PgFailure::SerializationFailure | PgFailure::Deadlock => StoreError::Conflict { message: message() },
        PgFailure::PermissionDenied => StoreError::PermissionDenied { message: message() },
        PgFailure::LockTimeout => StoreError::Timeout { what: "a lock (lock_timeout)".into() },
        PgFailure::StatementTimeout => StoreError::Timeout { what: "the statement (statement_timeout)".into() },
        PgFailure::ConnectionLost => StoreError::Unavailable { message: message() },
        PgFailure::BrokenConnection => {
            StoreError::Unavailable { message: "connection left in an unknown transaction state".into() }
        }
        PgFailure::UniqueViolation { .. } | PgFailure::Other => StoreError::Database { message: message() },
    }
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
    fn names_fields_from_constraints() {
        assert_eq!(constraint_field("adk_sessions_session_id_sane"), "session_id");
        assert_eq!(constraint_field("adk_sessions_state_is_object"), "state");
        assert_eq!(scope_of("adk_user_states_state_size"), "user");
    }
}
