//! Redacting one event (`SessionStore::redact_event`): one call of
//! `adk_redact_event`, which locks the session as an append does, replaces
//! the event's payload with its tombstone and writes the audit row.

use adk_postgres_domain::redaction::{check_event_id, check_reason};
use adk_postgres_domain::{RedactOptions, Redacted, SessionKey, StoreError};

use crate::conn::Load as _;
use crate::error::from_diesel;
use crate::functions::{self as sql, RedactOutcome, RedactRow};
use crate::pool::with_retries;
use crate::store::{PgSessionStore, only_row, version};

impl PgSessionStore {
    pub(crate) async fn redact_stored_event(
        &self,
        key: &SessionKey,
        event_id: &str,
        reason: &str,
        options: RedactOptions,
    ) -> Result<Redacted, StoreError> {
        check_event_id(event_id)?;
        check_reason(reason)?;
        let row = with_retries!(self, |conn| sql::RedactEvent {
            key: self.key_args(key),
            event_id,
            reason,
            state_delta: options.state_delta,
        }
        .load::<RedactRow>(&mut conn)
        .await
        .map_err(|e| from_diesel(e, "reason"))
        .and_then(|rows| only_row(rows, "adk_redact_event")))?;
        let stored = |row: RedactRow, already_redacted| match (row.seq, row.payload) {
            (Some(seq), Some(event)) => Ok(Redacted { seq: version(seq), event: event.0, already_redacted }),
            _ => Err(StoreError::Database { message: "adk_redact_event answered without the event".into() }),
        };
        match row.outcome {
            RedactOutcome::Redacted => stored(row, false),
            RedactOutcome::Already => stored(row, true),
            RedactOutcome::NotFound => Err(StoreError::NotFound(key.clone())),
            RedactOutcome::NoEvent => {
                Err(StoreError::EventNotFound { key: key.clone(), event_id: event_id.to_owned() })
            }
        }
    }
}
