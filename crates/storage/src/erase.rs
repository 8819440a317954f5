//! Erasing a user (issue #16): placeholder until its migration lands.

use adk_postgres_domain::{AppName, Erasure, StoreError, UserId};

use crate::store::PgSessionStore;

impl PgSessionStore {
    pub(crate) async fn erase_user_data(&self, _app: &AppName, _user: &UserId) -> Result<Erasure, StoreError> {
        Err(StoreError::Database { message: "erase_user is not built yet".into() })
    }
}
