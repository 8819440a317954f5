//! User and app state without a session: one call each of
//! `adk_get_user_state`, `adk_get_app_state`, `adk_merge_user_state` and
//! `adk_merge_app_state` (crates/schema/sql/state.sql). A merge is the
//! append's own upsert of that scope, under the same row lock, so the two
//! never lose each other's keys. Session state has no setter here: events
//! alone write it, so rewind and fork can rebuild it.

use adk_postgres_domain::state::check_scope_delta;
use adk_postgres_domain::{AppName, State, StoreError, UserId};

use super::{PgSessionStore, only_row, stored_state, to_json};
use crate::conn::Load as _;
use crate::error::from_diesel;
use crate::functions::{self as sql, ScopeStateRow};
use crate::pool::with_retries;

/// The field a database refusal of a delta names: `delta (user scope)` for
/// a merged state over the size cap, as the store's own check does.
const DELTA_FIELD: &str = "delta";

impl PgSessionStore {
    pub(super) async fn read_user_state(&self, app: &AppName, user: &UserId) -> Result<State, StoreError> {
        let row = with_retries!(self, |conn| sql::GetUserState {
            tenant: self.tenant_for(app),
            app_name: app.as_str(),
            user_id: user.as_str(),
        }
        .load::<ScopeStateRow>(&mut conn)
        .await
        .map_err(|e| from_diesel(e, DELTA_FIELD))
        .and_then(|rows| only_row(rows, "adk_get_user_state")))?;
        stored_state("user state", row.state)
    }

    pub(super) async fn read_app_state(&self, app: &AppName) -> Result<State, StoreError> {
        let row =
            with_retries!(self, |conn| sql::GetAppState { tenant: self.tenant_for(app), app_name: app.as_str() }
                .load::<ScopeStateRow>(&mut conn)
                .await
                .map_err(|e| from_diesel(e, DELTA_FIELD))
                .and_then(|rows| only_row(rows, "adk_get_app_state")))?;
        stored_state("app state", row.state)
    }

    pub(super) async fn merge_user_delta(
        &self,
        app: &AppName,
        user: &UserId,
        delta: State,
    ) -> Result<State, StoreError> {
        check_scope_delta(DELTA_FIELD, "user", &delta)?;
        let delta = to_json(delta);
        let row = with_retries!(self, |conn| sql::MergeUserState {
            tenant: self.tenant_for(app),
            app_name: app.as_str(),
            user_id: user.as_str(),
            delta: &delta,
        }
        .load::<ScopeStateRow>(&mut conn)
        .await
        .map_err(|e| from_diesel(e, DELTA_FIELD))
        .and_then(|rows| only_row(rows, "adk_merge_user_state")))?;
        stored_state("user state", row.state)
    }

    pub(super) async fn merge_app_delta(&self, app: &AppName, delta: State) -> Result<State, StoreError> {
        check_scope_delta(DELTA_FIELD, "app", &delta)?;
        let delta = to_json(delta);
        let row = with_retries!(self, |conn| sql::MergeAppState {
            tenant: self.tenant_for(app),
            app_name: app.as_str(),
            delta: &delta,
        }
        .load::<ScopeStateRow>(&mut conn)
        .await
        .map_err(|e| from_diesel(e, DELTA_FIELD))
        .and_then(|rows| only_row(rows, "adk_merge_app_state")))?;
        stored_state("app state", row.state)
    }
}
