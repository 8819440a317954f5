//! Forking a session (issue #16): placeholder until its migration lands.

use adk_postgres_domain::{Session, SessionKey, StoreError};

use crate::store::PgSessionStore;

impl PgSessionStore {
    pub(crate) async fn fork_session(
        &self,
        _key: &SessionKey,
        _at_seq: u64,
        _new_id: Option<String>,
    ) -> Result<Session, StoreError> {
        Err(StoreError::Database { message: "fork is not built yet".into() })
    }
}
