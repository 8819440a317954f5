//! [`PgSessionStore`]: the `SessionStore` contract on PostgreSQL.
//!
//! Round trips are the budget. Every operation calls one of the store's SQL
//! functions through its typed wrapper ([`crate::functions`]): `create`,
//! `append`, `list` and `delete` are one call each, `get` is two (the session
//! row with live app and user state, then its events with `session_day`
//! bound so one partition is read). None of them opens an explicit
//! transaction: each statement is atomic on its own.
//!
//! One file per resource, each an `impl PgSessionStore` block with that
//! resource's operations: `sessions` (create, get, list, delete, find,
//! metadata, rollover), `events` (append, rewind), `paging` (a page of
//! events, an app's sessions across users), `fork`, `redact` (one
//! event's tombstone), `state` (user and app state without a session),
//! `erase` (a user's data) and [`feed`] (the live change feed). This file holds the
//! store itself and the `SessionStore` face; the operations call one
//! another directly, never through the `SessionStore` methods, so a
//! caller's call is one span and one measurement however many statements
//! it takes. The pool's fair gate and conflict retry are the pool's
//! ([`crate::pool`]).

use std::future::Future;
use std::time::Duration;

use adk_postgres_domain::state::state_from_value;
use adk_postgres_domain::{
    AppName, AppSessionPage, AppendOptions, Appended, CreateSession, Erasure, Event, EventPage, EventsPage, GetOptions,
    JsonSession, ListAppSessions, ListSessions, RedactOptions, Redacted, Session, SessionId, SessionKey,
    SessionMetadata, SessionPage, SessionStore, State, StoreConfig, StoreError, UserId,
};
use async_trait::async_trait;
use diesel::data_types::PgInterval;
use serde_json::Value;

use crate::functions::KeyArgs;
use crate::observe::{Observation, Operation};
use crate::pool::{FairGate, PgPool, PoolBuildError, PoolConfig, build_pool, build_pool_with, no_answer};

mod erase;
mod events;
pub mod feed;
mod fork;
pub(crate) mod media;
mod paging;
mod redact;
mod sessions;
mod state;

pub use crate::pool::CheckoutObserver;
pub use erase::{DEFAULT_ERASE_BATCH, EraseOptions, EraseProgress, EraseStep, ErasureReport, MAX_ERASE_BATCH};

/// Which app a store says it acts for. The store's SQL functions check it
/// against the apps the connected role is bound to (`adk-pg service-role
/// --app`): a role that does not own the store finds nothing of, and writes
/// nothing to, an app it was not bound to or did not name. The owner acts
/// for every app.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum TenantScope {
    /// Name no app: for a store running as the tables' owner. A bound
    /// service role must name its app, so with `Off` it finds nothing and
    /// its writes are refused.
    #[default]
    Off,
    /// Each operation acts for the app named in its own request: one pool
    /// serves the role's apps, and no statement can touch a row of an app
    /// other than the one it was asked about. `find_by_id`, which has no
    /// app, searches the apps the role is bound to.
    PerRequest,
    /// Every operation acts for this one app; requests about any other app
    /// find nothing and can write nothing.
    Fixed(AppName),
}

/// The Postgres session store. Cheap to clone: clones share the pool.
#[derive(Clone)]
pub struct PgSessionStore {
    pub(crate) pool: PgPool,
    pub(crate) gate: std::sync::Arc<FairGate>,
    config: StoreConfig,
    tenant: TenantScope,
    /// Where the change feed listens, when not where the pool connects: it
    /// needs a session of its own, which a transaction pooler cannot give.
    pub(crate) change_feed: Option<std::sync::Arc<adk_postgres_connect::ConnectConfig>>,
}

impl std::fmt::Debug for PgSessionStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgSessionStore")
            .field("pool", &self.pool.state())
            .field("config", &self.config)
            .field("tenant", &self.tenant)
            .finish()
    }
}

/// Stored JSON that is not an object means someone wrote to the tables
/// behind the store's back; report it rather than guess.
fn stored_state(which: &str, value: Option<Value>) -> Result<State, StoreError> {
    state_from_value(which, value.unwrap_or(Value::Null))
        .map_err(|e| StoreError::Database { message: format!("stored {which} is corrupt: {e}") })
}

/// The row of a statement read to its end, or none. Every statement is read
/// with `load`, never diesel-async's `get_result`/`first`: those return on
/// the first row and drop the stream before PostgreSQL's ReadyForQuery, and
/// an autocommit statement commits only then, so a failed commit (or a
/// connection lost at that moment) would go unseen and an append that never
/// committed would be acknowledged.
fn single<T>(rows: Vec<T>) -> Option<T> {
    rows.into_iter().next()
}

/// The one row a store function always returns.
pub(crate) fn only_row<T>(rows: Vec<T>, function: &str) -> Result<T, StoreError> {
    single(rows).ok_or_else(|| StoreError::Database { message: format!("{function} returned no row") })
}

pub(crate) fn version(seq: i64) -> u64 {
    u64::try_from(seq).unwrap_or_default()
}

pub(crate) fn interval(field: &str, d: Duration) -> Result<PgInterval, StoreError> {
    i64::try_from(d.as_micros()).map(PgInterval::from_microseconds).map_err(|_| StoreError::invalid(field, "too long"))
}

fn to_json(state: State) -> Value {
    Value::Object(state)
}

impl PgSessionStore {
    /// A store on `pool`, acting as the connecting role for every app
    /// ([`TenantScope::Off`]) and without a separate change feed URL.
    pub fn new(pool: PgPool, config: StoreConfig) -> Self {
        #[cfg(feature = "metrics")]
        crate::observe::describe_metrics();
        let gate = std::sync::Arc::new(FairGate::new(&pool));
        Self { pool, gate, config, tenant: TenantScope::Off, change_feed: None }
    }

    /// The same store acting for `tenant` (see [`TenantScope`]). The app is
    /// set inside each operation's own transaction, at no extra round trip.
    pub fn with_tenant_scope(mut self, tenant: TenantScope) -> Self {
        self.tenant = tenant;
        self
    }

    /// The change feed ([`Self::watch`], [`Self::watch_app`]) listens through
    /// `url` instead of the pool's: LISTEN needs a session that stays its
    /// own between transactions, so behind a transaction pooler the feed
    /// needs a direct URL to the server. Its TLS and other settings are
    /// `url`'s own; a password provider is not carried over.
    pub fn with_change_feed_url(self, url: &str) -> Result<Self, StoreError> {
        let config = adk_postgres_connect::ConnectConfig::from_url(url)
            .map_err(|e| StoreError::invalid("change_feed_url", e.to_string()))?;
        Ok(self.with_change_feed_config(config))
    }

    /// [`Self::with_change_feed_url`] from connection settings already made.
    pub fn with_change_feed_config(mut self, config: adk_postgres_connect::ConnectConfig) -> Self {
        self.change_feed = Some(std::sync::Arc::new(config));
        self
    }

    /// Reports every operation's wait for a connection to `observer`. One
    /// observer per pool: the clones of a store share it, and a second call
    /// keeps the first.
    pub fn with_checkout_observer(self, observer: CheckoutObserver) -> Self {
        self.gate.observe_with(observer);
        self
    }

    /// Which app each call names to the database.
    pub fn tenant_scope(&self) -> &TenantScope {
        &self.tenant
    }

    /// The `adk.app_name` an operation about `app` runs under.
    pub(crate) fn tenant_for<'a>(&'a self, app: &'a AppName) -> Option<&'a str> {
        match &self.tenant {
            TenantScope::Off => None,
            TenantScope::PerRequest => Some(app.as_str()),
            TenantScope::Fixed(tenant) => Some(tenant.as_str()),
        }
    }

    pub(crate) fn key_args<'a>(&'a self, key: &'a SessionKey) -> KeyArgs<'a> {
        KeyArgs {
            tenant: self.tenant_for(&key.app_name),
            app_name: key.app_name.as_str(),
            user_id: key.user_id.as_str(),
            session_id: key.session_id.as_str(),
        }
    }

    /// Builds a pool for `database_url` (a libpq connection string) and a
    /// store on it.
    pub async fn connect(
        database_url: &str,
        pool_config: &PoolConfig,
        config: StoreConfig,
    ) -> Result<Self, PoolBuildError> {
        Ok(Self::new(build_pool(database_url, pool_config).await?, config))
    }

    /// [`Self::connect`] from connection settings already made, e.g. with
    /// a password provider for IAM tokens.
    pub async fn connect_with(
        connect: adk_postgres_connect::ConnectConfig,
        pool_config: &PoolConfig,
        config: StoreConfig,
    ) -> Result<Self, PoolBuildError> {
        Ok(Self::new(build_pool_with(connect, pool_config).await?, config))
    }

    /// Runs one store call within the pool's operation bound. Past it the
    /// connection in use is discarded by the pool (it is still busy) and
    /// the caller gets a retryable `Unavailable`: the statement may or may
    /// not have committed, and retrying with the same event id is safe.
    async fn bounded<T>(&self, call: impl Future<Output = Result<T, StoreError>>) -> Result<T, StoreError> {
        let bound = self.pool.operation_timeout();
        tokio::time::timeout(bound, call).await.unwrap_or_else(|_elapsed| Err(no_answer(bound)))
    }

    /// The pool the store's operations run on.
    pub fn pool(&self) -> &PgPool {
        &self.pool
    }

    /// The client's settings: default TTL, lifetime, media offload size.
    pub fn config(&self) -> &StoreConfig {
        &self.config
    }
}

#[async_trait]
impl SessionStore for PgSessionStore {
    async fn create(&self, request: CreateSession) -> Result<Session, StoreError> {
        Observation::new(Operation::Create, Some(&request.app_name))
            .run(self.bounded(self.create_session(request)))
            .await
    }

    async fn get(&self, key: &SessionKey, options: GetOptions) -> Result<Session, StoreError> {
        Observation::new(Operation::Get, Some(&key.app_name)).run(self.bounded(self.load_session(key, options))).await
    }

    /// The events as the server sent their jsonb, copied into one buffer
    /// without being parsed (only events naming media are, to put it back).
    async fn get_json(&self, key: &SessionKey, options: GetOptions) -> Result<JsonSession, StoreError> {
        Observation::new(Operation::Get, Some(&key.app_name))
            .run(self.bounded(self.load_json_session(key, options)))
            .await
    }

    async fn list(&self, request: &ListSessions) -> Result<SessionPage, StoreError> {
        Observation::new(Operation::List, Some(&request.app_name)).run(self.bounded(self.list_sessions(request))).await
    }

    async fn delete(&self, key: &SessionKey) -> Result<(), StoreError> {
        Observation::new(Operation::Delete, Some(&key.app_name)).run(self.bounded(self.delete_session(key))).await
    }

    async fn append(&self, key: &SessionKey, event: Event, options: AppendOptions) -> Result<Appended, StoreError> {
        Observation::new(Operation::Append, Some(&key.app_name))
            .run(self.bounded(self.append_event(key, event, options)))
            .await
    }

    async fn rollover(
        &self,
        key: &SessionKey,
        successor_id: Option<String>,
        summary: Event,
    ) -> Result<Session, StoreError> {
        Observation::new(Operation::Rollover, Some(&key.app_name))
            .run(self.bounded(self.rollover_session(key, successor_id, summary)))
            .await
    }

    async fn find_by_id(&self, session_id: &SessionId, limit: usize) -> Result<Vec<SessionKey>, StoreError> {
        // The request names no app; a store fixed to one searches only it.
        let app = match &self.tenant {
            TenantScope::Fixed(app) => Some(app),
            TenantScope::Off | TenantScope::PerRequest => None,
        };
        Observation::new(Operation::FindById, app).run(self.bounded(self.find_sessions(session_id, limit))).await
    }

    async fn rewind(&self, key: &SessionKey, keep: u64, expected_version: Option<u64>) -> Result<Session, StoreError> {
        Observation::new(Operation::Rewind, Some(&key.app_name))
            .run(self.bounded(self.rewind_session(key, keep, expected_version)))
            .await
    }

    async fn set_metadata(&self, key: &SessionKey, metadata: SessionMetadata) -> Result<(), StoreError> {
        Observation::new(Operation::SetMetadata, Some(&key.app_name))
            .run(self.bounded(self.set_session_metadata(key, metadata)))
            .await
    }

    async fn erase_user(&self, app: &AppName, user: &UserId) -> Result<Erasure, StoreError> {
        Observation::new(Operation::EraseUser, Some(app)).run(self.erase_user_data(app, user)).await
    }

    async fn fork(&self, key: &SessionKey, at_seq: u64, new_id: Option<String>) -> Result<Session, StoreError> {
        Observation::new(Operation::Fork, Some(&key.app_name))
            .run(self.bounded(self.fork_session(key, at_seq, new_id)))
            .await
    }

    async fn redact_event(
        &self,
        key: &SessionKey,
        event_id: &str,
        reason: &str,
        options: RedactOptions,
    ) -> Result<Redacted, StoreError> {
        Observation::new(Operation::RedactEvent, Some(&key.app_name))
            .run(self.bounded(self.redact_stored_event(key, event_id, reason, options)))
            .await
    }

    async fn get_user_state(&self, app: &AppName, user: &UserId) -> Result<State, StoreError> {
        Observation::new(Operation::GetUserState, Some(app)).run(self.bounded(self.read_user_state(app, user))).await
    }

    async fn get_app_state(&self, app: &AppName) -> Result<State, StoreError> {
        Observation::new(Operation::GetAppState, Some(app)).run(self.bounded(self.read_app_state(app))).await
    }

    async fn merge_user_state(&self, app: &AppName, user: &UserId, delta: State) -> Result<State, StoreError> {
        Observation::new(Operation::MergeUserState, Some(app))
            .run(self.bounded(self.merge_user_delta(app, user, delta)))
            .await
    }

    async fn merge_app_state(&self, app: &AppName, delta: State) -> Result<State, StoreError> {
        Observation::new(Operation::MergeAppState, Some(app)).run(self.bounded(self.merge_app_delta(app, delta))).await
    }

    async fn list_events(&self, key: &SessionKey, page: EventPage) -> Result<EventsPage, StoreError> {
        Observation::new(Operation::ListEvents, Some(&key.app_name))
            .run(self.bounded(self.list_events_page(key, page)))
            .await
    }

    async fn list_app_sessions(&self, request: &ListAppSessions) -> Result<AppSessionPage, StoreError> {
        Observation::new(Operation::ListAppSessions, Some(&request.app_name))
            .run(self.bounded(self.list_app_sessions_page(request)))
            .await
    }
}
