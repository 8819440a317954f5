//! User and app state without a session, on [`PgSessionService`]: adk's
//! `SessionService` trait has no slot for them, so they are reached here,
//! as the store offers them (`SessionStore::get_user_state` and the rest).
//!
//! Keys are the scope's own, without the `user:`/`app:` prefix a session's
//! state shows them with. A merge has the semantics of an append's `user:`
//! or `app:` delta and takes the same row lock, so it never loses an
//! agent's concurrent update, nor the agent its. There is no setter for a
//! session's own state: events alone write it, so rewind can rebuild it.

use std::collections::HashMap;

use adk_core::Result;
use adk_postgres_domain::{AppName, State, UserId};
use serde_json::Value;

use crate::error::to_adk_error;
use crate::service::PgSessionService;
use crate::state::{to_store_state, validate_keys};

fn app_of(app_name: &str) -> Result<AppName> {
    AppName::new(app_name).map_err(to_adk_error)
}

fn user_of(user_id: &str) -> Result<UserId> {
    UserId::new(user_id).map_err(to_adk_error)
}

fn to_adk_state(state: State) -> HashMap<String, Value> {
    state.into_iter().collect()
}

impl PgSessionService {
    /// The user's state in the app (keys without `user:`); `{}` when the
    /// user has none.
    pub async fn get_user_state(&self, app_name: &str, user_id: &str) -> Result<HashMap<String, Value>> {
        let (app, user) = (app_of(app_name)?, user_of(user_id)?);
        self.store().get_user_state(&app, &user).await.map(to_adk_state).map_err(to_adk_error)
    }

    /// The app's state (keys without `app:`); `{}` when the app has none.
    pub async fn get_app_state(&self, app_name: &str) -> Result<HashMap<String, Value>> {
        let app = app_of(app_name)?;
        self.store().get_app_state(&app).await.map(to_adk_state).map_err(to_adk_error)
    }

    /// Merges `delta` (keys without `user:`) into the user's state and
    /// returns the state after it. A prefixed or malformed key is
    /// `session.invalid_state_key`, a merged state over 64 KiB
    /// `session.state_too_large`; nothing is written then.
    pub async fn merge_user_state(
        &self,
        app_name: &str,
        user_id: &str,
        delta: &HashMap<String, Value>,
    ) -> Result<HashMap<String, Value>> {
        let (app, user) = (app_of(app_name)?, user_of(user_id)?);
        validate_keys("delta", delta.keys())?;
        self.store().merge_user_state(&app, &user, to_store_state(delta)).await.map(to_adk_state).map_err(to_adk_error)
    }

    /// Merges `delta` (keys without `app:`) into the app's state, shared by
    /// all its users, and returns the state after it; errors as for
    /// [`PgSessionService::merge_user_state`].
    pub async fn merge_app_state(
        &self,
        app_name: &str,
        delta: &HashMap<String, Value>,
    ) -> Result<HashMap<String, Value>> {
        let app = app_of(app_name)?;
        validate_keys("delta", delta.keys())?;
        self.store().merge_app_state(&app, to_store_state(delta)).await.map(to_adk_state).map_err(to_adk_error)
    }
}

#[cfg(test)]
mod tests {
    use adk_postgres_domain::InMemoryStore;
    use serde_json::json;

    use super::*;
    use crate::codes;

    fn map(value: Value) -> HashMap<String, Value> {
        value.as_object().cloned().map(|m| m.into_iter().collect()).unwrap_or_default()
    }

    #[tokio::test]
    async fn merges_and_reads_through_the_service() {
        let service = PgSessionService::from_store(InMemoryStore::new());
        assert!(service.get_user_state("app", "u1").await.expect("get").is_empty());
        let merged = service.merge_user_state("app", "u1", &map(json!({"tier": "gold"}))).await.expect("merge");
        assert_eq!(merged, map(json!({"tier": "gold"})));
        assert_eq!(service.get_user_state("app", "u1").await.expect("get"), merged);
        service.merge_app_state("app", &map(json!({"motd": null}))).await.expect("merge app");
        assert_eq!(service.get_app_state("app").await.expect("get app"), map(json!({"motd": null})));
    }

    #[tokio::test]
    async fn bad_keys_and_ids_are_refused_with_adk_codes() {
        let service = PgSessionService::from_store(InMemoryStore::new());
        for key in ["user:tier", "a/b"] {
            let err = service.merge_user_state("app", "u1", &map(json!({ key: 1 }))).await.unwrap_err();
            assert_eq!(err.code, codes::INVALID_STATE_KEY, "{key}: {err}");
        }
        let err = service.get_user_state("", "u1").await.unwrap_err();
        assert_eq!(err.code, codes::INVALID_IDENTITY, "{err}");
        assert!(service.get_user_state("app", "u1").await.expect("get").is_empty(), "nothing written");
    }
}
