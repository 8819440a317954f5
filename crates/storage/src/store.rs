//! [`PgSessionStore`]: the `SessionStore` contract on PostgreSQL.
//!
//! Round trips are the budget. Every operation calls one of the store's SQL
//! functions through its typed wrapper ([`crate::functions`]): `create`,
//! `append`, `list` and `delete` are one call each, `get` is two (the session
//! row with live app and user state, then its events with `session_day`
//! bound so one partition is read). None of them opens an explicit
//! transaction: each statement is atomic on its own.

use std::collections::BTreeMap;
use std::future::Future;
use std::time::Duration;

use adk_postgres_domain::event::timestamp_to_nanos;
use adk_postgres_domain::state::{SharedScopes, merge_scopes, state_from_value};
use adk_postgres_domain::{
    AppName, AppendOptions, Appended, CreateSession, Erasure, Event, GetOptions, ListSessions, OnExisting, PageToken,
    ScopedState, Session, SessionId, SessionKey, SessionMetadata, SessionPage, SessionStore, SessionSummary, State,
    StoreConfig, StoreError, UserId,
};
use async_trait::async_trait;
use chrono::{DateTime, Utc};
use diesel::data_types::PgInterval;
use serde_json::Value;

use crate::conn::Load as _;
use crate::error::from_diesel;
use crate::functions::{
    self as sql, AppendOutcome, AppendRow, CreatedRow, DeletedRow, FoundRow, GetRow, KeyArgs, MetadataOutcome,
    MetadataRow, PremadeRow, RewindOutcome, RewindRow, RolloverOutcome, RolloverRow, SummaryRow,
};
use crate::observe::{Observation, Operation};
use crate::policy::interval_duration;
use crate::pool::{PgPool, PoolBuildError, PoolConfig, build_pool, build_pool_with};

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

/// Tries per operation when it keeps losing deadlock or serialization races.
const CONFLICT_ATTEMPTS: u32 = 5;

/// Decides whether an operation that lost a deadlock or serialization race
/// runs again, and waits a short, growing, jittered pause before it does.
/// Every operation is one autocommit statement, so a failed attempt left
/// nothing behind.
#[derive(Debug)]
pub(crate) struct ConflictRetry {
    attempt: u32,
    pause: Duration,
}

impl Default for ConflictRetry {
    fn default() -> Self {
        Self { attempt: 1, pause: Duration::from_millis(5) }
    }
}

impl ConflictRetry {
    pub(crate) async fn again<T>(&mut self, result: &Result<T, StoreError>) -> bool {
        let Err(StoreError::Conflict { message }) = result else { return false };
        if self.attempt >= CONFLICT_ATTEMPTS {
            return false;
        }
        tracing::debug!(attempt = self.attempt, %message, "retrying after a conflict");
        // Jitter keeps two losers of the same race from meeting again.
        let jitter = Duration::from_micros(u64::from(uuid::Uuid::new_v4().as_u128() as u16));
        tokio::time::sleep(self.pause + jitter).await;
        self.pause = self.pause.saturating_mul(3);
        self.attempt += 1;
        true
    }
}

/// What a call whose bound passed returns.
pub(crate) fn no_answer(bound: Duration) -> StoreError {
    StoreError::Unavailable {
        message: format!(
            "no answer from the database within {bound:?} (operation_timeout); the connection was discarded \
             and the statement may or may not have committed: retry (the same event id is safe)"
        ),
    }
}

/// Runs `$query`, an expression over `$conn` (a pooled connection, fresh
/// for each attempt), again while it loses deadlock or serialization races.
macro_rules! with_retries {
    ($store:expr, |$conn:ident| $query:expr) => {{
        let mut retry = $crate::store::ConflictRetry::default();
        loop {
            // Declared first so it is released last, after the connection
            // went back to the pool.
            let _turn = $store.gate.enter().await?;
            let mut $conn = $store.pool.get().await.map_err($crate::error::from_pool)?;
            // Each statement is bounded too, for calls made of many (an
            // erasure's batches); a statement cut off leaves its connection
            // busy, so the pool discards it.
            let result = match tokio::time::timeout($store.pool.operation_timeout(), async { $query }).await {
                Ok(result) => result,
                Err(_elapsed) => Err($crate::store::no_answer($store.pool.operation_timeout())),
            };
            if matches!(result, Err(adk_postgres_domain::StoreError::Unavailable { .. })) {
                // A backend killed by the server is only seen as closed
                // once the driver has read the end of the stream, which may
                // be after the pool takes the connection back.
                $conn.discard();
            }
            if !retry.again(&result).await {
                break result;
            }
        }
    }};
}
pub(crate) use with_retries;

/// Hands out turns at the pool in arrival order. bb8 wakes one waiter when a
/// connection comes back, but a caller arriving in between can take it
/// first, so under a crowd some waiters starve past the checkout timeout
/// although the average wait is short. A FIFO semaphore with one permit per
/// connection in front of `get` makes every wait bounded by the queue ahead.
pub(crate) struct FairGate {
    turns: tokio::sync::Semaphore,
    /// Longest a caller queues before `Overloaded`: the pool's own checkout
    /// timeout, so the gate never waits longer than bb8 would have.
    patience: Duration,
    /// Callers queued beyond this get `Overloaded` at once instead of
    /// queueing; far above any sane crowd, it only bounds memory.
    max_waiting: usize,
    waiting: std::sync::atomic::AtomicUsize,
    observer: std::sync::OnceLock<CheckoutObserver>,
}

/// Called with how long each operation waited for its turn at the pool
/// (zero when a connection was free), whether it got one or was refused:
/// for a caller's own metrics, e.g. a wait histogram.
pub type CheckoutObserver = std::sync::Arc<dyn Fn(Duration) + Send + Sync>;

impl std::fmt::Debug for FairGate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FairGate")
            .field("turns", &self.turns.available_permits())
            .field("waiting", &self.waiting)
            .field("patience", &self.patience)
            .field("observed", &self.observer.get().is_some())
            .finish()
    }
}

/// A caller's turn; the next caller in line goes when it is dropped.
type Turn<'a> = tokio::sync::SemaphorePermit<'a>;

impl FairGate {
    fn new(pool: &PgPool) -> Self {
        Self {
            turns: tokio::sync::Semaphore::new(usize::try_from(pool.max_size()).unwrap_or(1).max(1)),
            patience: pool.connection_timeout(),
            max_waiting: 100_000,
            waiting: std::sync::atomic::AtomicUsize::new(0),
            observer: std::sync::OnceLock::new(),
        }
    }

    pub(crate) async fn enter(&self) -> Result<Turn<'_>, StoreError> {
        use std::sync::atomic::Ordering::Relaxed;
        if let Ok(turn) = self.turns.try_acquire() {
            self.observe(Duration::ZERO);
            return Ok(turn);
        }
        let ahead = self.waiting.fetch_add(1, Relaxed);
        let started = tokio::time::Instant::now();
        let outcome = if ahead >= self.max_waiting {
            None
        } else {
            // Cancelling a semaphore wait is harmless: nothing was sent.
            tokio::time::timeout(self.patience, self.turns.acquire()).await.ok()
        };
        self.waiting.fetch_sub(1, Relaxed);
        self.observe(started.elapsed());
        match outcome {
            Some(Ok(turn)) => Ok(turn),
            Some(Err(_closed)) => Err(StoreError::Unavailable { message: "the store is shut down".into() }),
            None => Err(StoreError::Overloaded { waiting: ahead + 1, waited: started.elapsed() }),
        }
    }

    fn observe(&self, waited: Duration) {
        if let Some(observer) = self.observer.get() {
            observer(waited);
        }
    }
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

fn stored_event(payload: Value) -> Result<Event, StoreError> {
    Event::from_value(payload).map_err(|e| StoreError::Database { message: format!("stored event is corrupt: {e}") })
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

fn version(seq: i64) -> u64 {
    u64::try_from(seq).unwrap_or_default()
}

pub(crate) fn interval(field: &str, d: Duration) -> Result<PgInterval, StoreError> {
    i64::try_from(d.as_micros()).map(PgInterval::from_microseconds).map_err(|_| StoreError::invalid(field, "too long"))
}

fn to_json(state: State) -> Value {
    Value::Object(state)
}

/// Labels as the jsonb object the store's functions take.
fn labels_json(labels: &BTreeMap<String, String>) -> Value {
    Value::Object(labels.iter().map(|(k, v)| (k.clone(), Value::String(v.clone()))).collect())
}

/// An `updated_at` window bound as PostgreSQL compares it with stored update
/// times, which are whole microseconds: rounded up to the next microsecond,
/// which keeps both `t >= bound` and `t < bound` exact for every stored `t`
/// (binding it as is would truncate it, and a bound a few nanoseconds after
/// a session's update time would still include it), and never before
/// PostgreSQL's first instant, 4714 BC, before which nothing is stored.
fn window_bound(bound: DateTime<Utc>) -> DateTime<Utc> {
    let below = i64::from(bound.timestamp_subsec_nanos() % 1_000);
    let up = match below {
        0 => bound,
        // Past chrono's last instant (year 262143) there is nothing to round to.
        _ => bound.checked_add_signed(chrono::TimeDelta::nanoseconds(1_000 - below)).unwrap_or(bound),
    };
    let earliest = chrono::NaiveDate::from_ymd_opt(-4713, 11, 24)
        .and_then(|day| day.and_hms_opt(0, 0, 0))
        .map(|midnight| midnight.and_utc())
        .unwrap_or(DateTime::<Utc>::MIN_UTC);
    up.max(earliest)
}

/// The table's metadata checks (a trigger that fails like a CHECK
/// constraint, `adk_sessions_labels_sane` and the like) name the column; the
/// caller's field is under `metadata`, as the store's own checks name it.
/// Only a bound the store does not check itself reaches the table.
fn metadata_field(error: StoreError) -> StoreError {
    match error {
        StoreError::InvalidInput { field, reason }
            if field.starts_with("display_name") || field.starts_with("labels") =>
        {
            StoreError::InvalidInput { field: format!("metadata.{field}"), reason }
        }
        other => other,
    }
}

impl PgSessionStore {
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
        let _ = self.gate.observer.set(observer);
        self
    }

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

    pub fn pool(&self) -> &PgPool {
        &self.pool
    }

    pub fn config(&self) -> &StoreConfig {
        &self.config
    }

    /// Runs a write that may need today's event partition; when the
    /// partition is missing, makes the policy's partitions (through the
    /// narrow `adk_premake_event_partitions`, which runs as the tables' owner)
    /// and runs it once more. A new database or a store running as a
    /// service role never needs `adk-pg maintain` before its first append;
    /// a day the policy does not premake stays a loud `PartitionMissing`.
    async fn with_partition<T, F, Fut>(&self, mut write: F) -> Result<T, StoreError>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<T, StoreError>>,
    {
        match write().await {
            Err(missing @ StoreError::PartitionMissing { .. }) => {
                let premade = with_retries!(self, |conn| sql::PremakeEventPartitions
                    .load::<PremadeRow>(&mut conn)
                    .await
                    .map_err(|e| from_diesel(e, "state")));
                match premade {
                    Ok(rows) => {
                        let made = single(rows).and_then(|r| r.adk_premake_event_partitions).unwrap_or(0);
                        tracing::info!(%missing, made, "made missing event partitions");
                        write().await
                    }
                    Err(e) => {
                        tracing::warn!(%missing, error = %e, "could not make the missing event partition");
                        Err(missing)
                    }
                }
            }
            other => other,
        }
    }
}

/// The operations themselves. They call one another through these, never
/// through the `SessionStore` methods, so a caller's call is one span and
/// one measurement however many statements it takes.
impl PgSessionStore {
    async fn set_session_metadata(&self, key: &SessionKey, metadata: SessionMetadata) -> Result<(), StoreError> {
        metadata.validate()?;
        let labels = labels_json(&metadata.labels);
        let row = with_retries!(self, |conn| sql::SetSessionMetadata {
            key: self.key_args(key),
            display_name: metadata.display_name.as_deref(),
            labels: &labels,
        }
        .load::<MetadataRow>(&mut conn)
        .await
        .map_err(|e| metadata_field(from_diesel(e, "state")))
        .and_then(|rows| only_row(rows, "adk_set_session_metadata")))?;
        match row.outcome {
            MetadataOutcome::Set => Ok(()),
            MetadataOutcome::NotFound => Err(StoreError::NotFound(key.clone())),
        }
    }

    async fn create_session(&self, request: CreateSession) -> Result<Session, StoreError> {
        let id = SessionId::from_requested(request.session_id.as_deref())?;
        request.metadata.validate()?;
        let scoped = ScopedState::split("state", &request.state)?;
        scoped.check_sizes("state")?;
        let ttl = request.ttl.or(self.config.default_ttl).map(|ttl| interval("ttl", ttl)).transpose()?;
        let key = SessionKey::new(request.app_name, request.user_id, id);
        let session_json = to_json(scoped.session.clone());
        let user_json = to_json(scoped.user);
        let app_json = to_json(scoped.app);
        let labels = labels_json(&request.metadata.labels);

        let created = with_retries!(self, |conn| sql::CreateSession {
            key: self.key_args(&key),
            state: &session_json,
            ttl,
            user_delta: &user_json,
            app_delta: &app_json,
            display_name: request.metadata.display_name.as_deref(),
            labels: &labels,
        }
        .load::<CreatedRow>(&mut conn)
        .await
        .map(single)
        .map_err(|e| metadata_field(from_diesel(e, "state"))))?;
        let Some(row) = created else {
            return match request.on_existing {
                OnExisting::ReturnExisting => match self.load_session(&key, GetOptions::default()).await {
                    Err(StoreError::NotFound(_)) => Err(StoreError::AlreadyExists(key)),
                    other => other,
                },
                OnExisting::Fail => Err(StoreError::AlreadyExists(key)),
            };
        };
        let user = stored_state("user state", row.user_state)?;
        let app = stored_state("app state", row.app_state)?;
        Ok(Session {
            state: merge_scopes(&scoped.session, &user, &app),
            key,
            events: Vec::new(),
            version: 0,
            last_update_time: row.updated_at,
            created_at: row.created_at,
            expires_at: row.expires_at,
            closed_at: None,
            successor: None,
            // As inserted: the create either wrote exactly these or nothing.
            metadata: request.metadata,
        })
    }

    pub(crate) async fn load_session(&self, key: &SessionKey, options: GetOptions) -> Result<Session, StoreError> {
        let after = options
            .after
            .map(|after| timestamp_to_nanos(after).unwrap_or(if after.timestamp() < 0 { i64::MIN } else { i64::MAX }));
        let limit = options.num_recent_events.map(|n| i64::try_from(n).unwrap_or(i64::MAX));
        let rows = with_retries!(self, |conn| sql::GetSession { key: self.key_args(key), after_ts: after, limit }
            .load::<GetRow>(&mut conn)
            .await
            .map_err(|e| from_diesel(e, "state")))?;
        let mut rows = rows.into_iter();
        let session = rows.next().ok_or_else(|| StoreError::NotFound(key.clone()))?;
        let corrupt = |what: &str| StoreError::Database { message: format!("adk_get_session returned no {what}") };
        let events = rows
            .map(|row| row.payload.map(|p| p.0).ok_or_else(|| corrupt("payload on an event row")))
            .collect::<Result<Vec<_>, _>>()?;
        let last_seq = session.last_seq.ok_or_else(|| corrupt("last_seq"))?;
        let session_state = stored_state("session state", session.state)?;
        let user = stored_state("user state", session.user_state)?;
        let app = stored_state("app state", session.app_state)?;
        Ok(Session {
            key: key.clone(),
            state: SharedScopes::new(&user, &app).merge_into(session_state),
            events,
            version: version(last_seq),
            last_update_time: session.updated_at.ok_or_else(|| corrupt("updated_at"))?,
            created_at: session.created_at.ok_or_else(|| corrupt("created_at"))?,
            expires_at: session.expires_at,
            closed_at: session.closed_at,
            successor: session
                .successor_id
                .map(SessionId::new)
                .transpose()
                .map_err(|e| StoreError::Database { message: format!("stored successor id is corrupt: {e}") })?,
            metadata: SessionMetadata {
                display_name: session.display_name,
                labels: session.labels.ok_or_else(|| corrupt("labels"))?.0,
            },
        })
    }

    async fn list_sessions(&self, request: &ListSessions) -> Result<SessionPage, StoreError> {
        request.validate_filters()?;
        let cursor = request.page_token.as_ref().map(PageToken::position).transpose()?;
        let (after_time, after_id) = match &cursor {
            Some((micros, id)) => (
                Some(
                    DateTime::<Utc>::from_timestamp_micros(*micros)
                        .ok_or_else(|| StoreError::invalid("page_token", "time out of range"))?,
                ),
                Some(id.as_str()),
            ),
            None => (None, None),
        };
        let page_size = request.effective_page_size();
        let labels = labels_json(&request.labels);
        let mut rows = with_retries!(self, |conn| sql::ListSessions {
            tenant: self.tenant_for(&request.app_name),
            app_name: request.app_name.as_str(),
            user_id: request.user_id.as_str(),
            after_time,
            after_id,
            // One more than a page tells whether another page follows.
            limit: page_size as i64 + 1,
            labels: &labels,
            updated_after: request.updated_after.map(window_bound),
            updated_before: request.updated_before.map(window_bound),
        }
        .load::<SummaryRow>(&mut conn)
        .await
        .map_err(|e| from_diesel(e, "state")))?;
        let more = rows.len() > page_size;
        let mut sessions = Vec::with_capacity(rows.len().min(page_size));
        // The page's user and app state come once, on its first row: the
        // same for every session of one app and user.
        let shared = match rows.first_mut() {
            Some(first) => SharedScopes::new(
                &stored_state("user state", first.user_state.take())?,
                &stored_state("app state", first.app_state.take())?,
            ),
            None => SharedScopes::default(),
        };
        for row in rows.into_iter().take(page_size) {
            let session_id = SessionId::new(row.session_id)
                .map_err(|e| StoreError::Database { message: format!("stored session id is corrupt: {e}") })?;
            let session_state = stored_state("session state", Some(row.state))?;
            sessions.push(SessionSummary {
                key: SessionKey::new(request.app_name.clone(), request.user_id.clone(), session_id),
                state: shared.merge_into(session_state),
                version: version(row.last_seq),
                last_update_time: row.updated_at,
                created_at: row.created_at,
                expires_at: row.expires_at,
                metadata: SessionMetadata { display_name: row.display_name, labels: row.labels.0 },
            });
        }
        let next_page_token = if more {
            sessions.last().map(|s| PageToken::after(s.last_update_time.timestamp_micros(), &s.key.session_id))
        } else {
            None
        };
        Ok(SessionPage { sessions, next_page_token })
    }

    async fn delete_session(&self, key: &SessionKey) -> Result<(), StoreError> {
        with_retries!(self, |conn| sql::DeleteSession { key: self.key_args(key) }
            .load::<DeletedRow>(&mut conn)
            .await
            .map_err(|e| from_diesel(e, "state")))?;
        Ok(())
    }

    async fn append_event(
        &self,
        key: &SessionKey,
        event: Event,
        options: AppendOptions,
    ) -> Result<Appended, StoreError> {
        if event.is_partial() {
            return Ok(Appended { event, seq: None, replayed: false, last_update_time: None });
        }
        let (event, prepared) = event.prepare_for_store()?;
        let expected = options
            .expected_version
            .map(|v| i64::try_from(v).map_err(|_| StoreError::invalid("expected_version", "out of range")))
            .transpose()?;
        let max_lifetime = self.config.max_session_lifetime.map(|d| interval("max_session_lifetime", d)).transpose()?;
        const DELTA_FIELD: &str = "event.actions.state_delta";
        let session_delta = to_json(prepared.delta.session);
        let user_delta = to_json(prepared.delta.user);
        let app_delta = to_json(prepared.delta.app);

        let row = self
            .with_partition(|| async {
                with_retries!(self, |conn| sql::AppendEvent {
                    key: self.key_args(key),
                    event_id: event.id.as_str(),
                    invocation_id: Some(event.invocation_id.as_str()).filter(|s| !s.is_empty()),
                    author: event.author.as_str(),
                    event_ts: prepared.event_ts,
                    payload: &prepared.payload,
                    session_delta: &session_delta,
                    user_delta: &user_delta,
                    app_delta: &app_delta,
                    expected_seq: expected,
                    max_lifetime,
                }
                .load::<AppendRow>(&mut conn)
                .await
                .map_err(|e| from_diesel(e, DELTA_FIELD))
                .and_then(|rows| only_row(rows, "adk_append_event")))
            })
            .await?;
        let seq = row.seq.map(version);
        match row.outcome {
            AppendOutcome::Stored => Ok(Appended { event, seq, replayed: false, last_update_time: row.updated_at }),
            AppendOutcome::Replayed => Ok(Appended {
                event: stored_event(row.payload.unwrap_or(Value::Null))?,
                seq,
                replayed: true,
                last_update_time: row.updated_at,
            }),
            AppendOutcome::Duplicate => Err(StoreError::DuplicateEvent { key: key.clone(), event_id: event.id }),
            AppendOutcome::Stale => Err(StoreError::StaleSession {
                key: key.clone(),
                expected: options.expected_version.unwrap_or_default(),
                actual: seq.unwrap_or_default(),
            }),
            AppendOutcome::NotFound => Err(StoreError::NotFound(key.clone())),
            AppendOutcome::Closed => Err(StoreError::SessionClosed {
                key: key.clone(),
                successor: row.successor_id.and_then(|s| SessionId::new(s).ok()),
            }),
            AppendOutcome::TooOld => Err(StoreError::LifetimeExceeded {
                key: key.clone(),
                max_lifetime: row.max_lifetime.as_ref().and_then(interval_duration).unwrap_or_default(),
            }),
        }
    }

    async fn rollover_session(
        &self,
        key: &SessionKey,
        successor_id: Option<String>,
        summary: Event,
    ) -> Result<Session, StoreError> {
        let successor_id = SessionId::from_requested(successor_id.as_deref())?;
        let (summary, prepared) = summary.prepare_summary()?;
        let ttl = self.config.default_ttl.map(|ttl| interval("ttl", ttl)).transpose()?;
        let successor = SessionKey::new(key.app_name.clone(), key.user_id.clone(), successor_id);
        let row = self
            .with_partition(|| async {
                with_retries!(self, |conn| sql::RolloverSession {
                    key: self.key_args(key),
                    successor_id: successor.session_id.as_str(),
                    event_id: summary.id.as_str(),
                    invocation_id: Some(summary.invocation_id.as_str()).filter(|s| !s.is_empty()),
                    author: summary.author.as_str(),
                    event_ts: prepared.event_ts,
                    payload: &prepared.payload,
                    ttl,
                }
                .load::<RolloverRow>(&mut conn)
                .await
                .map_err(|e| from_diesel(e, "state"))
                .and_then(|rows| only_row(rows, "adk_rollover_session")))
            })
            .await?;
        match row.outcome {
            // Also the answer to a retry whose first reply was lost: the
            // session is already closed with this very successor. The
            // successor is read whole, as it is now, with live app and user
            // state.
            RolloverOutcome::Rolled => self.load_session(&successor, GetOptions::default()).await,
            RolloverOutcome::NotFound => Err(StoreError::NotFound(key.clone())),
            RolloverOutcome::Closed => Err(StoreError::SessionClosed {
                key: key.clone(),
                successor: row.successor_id.and_then(|s| SessionId::new(s).ok()),
            }),
            RolloverOutcome::Exists => Err(StoreError::AlreadyExists(successor)),
        }
    }

    async fn find_sessions(&self, session_id: &SessionId, limit: usize) -> Result<Vec<SessionKey>, StoreError> {
        // Per request the app is not known yet, so no tenant is named: the
        // owner looks everywhere, any other role in the apps it is bound to.
        let tenant = match &self.tenant {
            TenantScope::Fixed(app) => Some(app.as_str()),
            TenantScope::Off | TenantScope::PerRequest => None,
        };
        let limit = i32::try_from(limit).unwrap_or(i32::MAX);
        let rows = with_retries!(self, |conn| sql::FindSessions { tenant, session_id: session_id.as_str(), limit }
            .load::<FoundRow>(&mut conn)
            .await
            .map_err(|e| from_diesel(e, "state")))?;
        rows.into_iter()
            .map(|row| {
                let corrupt = |e: StoreError| StoreError::Database { message: format!("stored key is corrupt: {e}") };
                Ok(SessionKey::new(
                    AppName::new(row.app_name).map_err(corrupt)?,
                    UserId::new(row.user_id).map_err(corrupt)?,
                    session_id.clone(),
                ))
            })
            .collect()
    }

    async fn rewind_session(
        &self,
        key: &SessionKey,
        keep: u64,
        expected_version: Option<u64>,
    ) -> Result<Session, StoreError> {
        let keep_seq = i64::try_from(keep).map_err(|_| StoreError::invalid("keep", "out of range"))?;
        let expected = expected_version
            .map(|v| i64::try_from(v).map_err(|_| StoreError::invalid("expected_version", "out of range")))
            .transpose()?;
        let row = with_retries!(self, |conn| sql::RewindSession {
            key: self.key_args(key),
            keep: keep_seq,
            expected_seq: expected
        }
        .load::<RewindRow>(&mut conn)
        .await
        .map_err(|e| from_diesel(e, "state"))
        .and_then(|rows| only_row(rows, "adk_rewind_session")))?;
        let current = row.seq.map(version).unwrap_or_default();
        match row.outcome {
            RewindOutcome::Rewound => self.load_session(key, GetOptions::default()).await,
            RewindOutcome::NotFound => Err(StoreError::NotFound(key.clone())),
            RewindOutcome::Stale => Err(StoreError::StaleSession {
                key: key.clone(),
                expected: expected_version.unwrap_or_default(),
                actual: current,
            }),
            RewindOutcome::Beyond => Err(StoreError::invalid("keep", format!("the session has only {current} events"))),
        }
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
}
