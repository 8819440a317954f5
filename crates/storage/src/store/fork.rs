//! Forking a session: a new conversation that starts from the first N
//! events of another (`SessionStore::fork`).

use adk_postgres_domain::{GetOptions, Session, SessionId, SessionKey, StoreError};

use crate::conn::Load as _;
use crate::error::from_diesel;
use crate::functions::{self as sql, ForkOutcome, ForkRow};
use crate::pool::with_retries;
use crate::store::{PgSessionStore, interval, only_row};

impl PgSessionStore {
    /// One call of `adk_fork_session` (the copy is atomic inside it), then a
    /// get of the new session, as rewind does: the fork's whole state is
    /// what a caller continues from.
    pub(crate) async fn fork_session(
        &self,
        key: &SessionKey,
        at_seq: u64,
        new_id: Option<String>,
    ) -> Result<Session, StoreError> {
        let new_id = SessionId::from_requested(new_id.as_deref())?;
        let fork_key = SessionKey::new(key.app_name.clone(), key.user_id.clone(), new_id);
        let at = i64::try_from(at_seq).map_err(|_| StoreError::invalid("at_seq", "out of range"))?;
        let ttl = self.config().default_ttl.map(|ttl| interval("ttl", ttl)).transpose()?;
        let row = with_retries!(self, |conn| sql::ForkSession {
            key: self.key_args(key),
            new_id: fork_key.session_id.as_str(),
            at_seq: at,
            ttl,
        }
        .load::<ForkRow>(&mut conn)
        .await
        .map_err(|e| from_diesel(e, "state"))
        .and_then(|rows| only_row(rows, "adk_fork_session")))?;
        match row.outcome {
            ForkOutcome::Forked => self.load_session(&fork_key, GetOptions::default()).await,
            ForkOutcome::NotFound => Err(StoreError::NotFound(key.clone())),
            ForkOutcome::Exists => Err(StoreError::AlreadyExists(fork_key)),
            ForkOutcome::Beyond => Err(StoreError::invalid(
                "at_seq",
                format!("the session has only {} events", row.seq.unwrap_or_default()),
            )),
        }
    }
}
