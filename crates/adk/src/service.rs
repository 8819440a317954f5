//! [`PgSessionService`]: adk's `SessionService` on a `SessionStore`.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use adk_core::Result;
use adk_postgres_domain::session::MAX_PAGE_SIZE;
use adk_postgres_domain::{
    AppName, AppendOptions, CreateSession, DEFAULT_LEASE_IDLE, GetOptions, ListSessions, SessionId, SessionKey,
    SessionStore, StoreError, UserId,
};
use adk_session::{
    AppendEventRequest, CreateRequest, DeleteRequest, Event, GetRequest, ListRequest, Session, SessionService,
};
use async_trait::async_trait;

use crate::error::{codes, invalid, not_found, to_adk_error};
use crate::event::to_store_event;
use crate::lease::{LeaseBook, ends_turn};
use crate::session::LoadedSession;
use crate::state::{to_store_state, validate_keys};

/// adk-rust's `SessionService` on the adk-postgres store.
///
/// Hand it to a `Runner` as its `session_service`; it is cheap to clone
/// (clones share the store and its pool). It runs over any
/// `Arc<dyn SessionStore>`: [`PgSessionService::connect`] builds the
/// PostgreSQL store, [`PgSessionService::new`] takes any store, such as
/// `InMemoryStore` in tests.
///
/// What it adds to adk's contract (each pinned by the crate's tests):
/// - `create` with a taken id fails (`session.already_exists`), never
///   overwrites; ids are trimmed; a blank id gets a UUIDv4;
/// - `get` returns the live `app:`/`user:` state, and `after` is exact to the
///   nanosecond;
/// - appends are idempotent per event id (a retry with the same content
///   succeeds once; other content is `session.duplicate_event`), `temp:` keys
///   and partial events are never stored, and concurrent `user:`/`app:`
///   updates from different sessions are never lost;
/// - `list` returns live state without events, newest first;
/// - every error has component `session`, a code from [`crate::codes`] and
///   the closest category (`session.not_found` is `NotFound`, bad identities
///   and state keys are `InvalidInput`, outages are retryable).
///
/// One invocation at a time per session: every append takes part in the
/// session's invocation lease (`adk_postgres_domain::lease`). While one
/// `Runner`'s invocation is running on a session, another invocation's
/// append fails with `session.busy` (retryable, `Unavailable`) instead of
/// landing among the first one's events. The lease ends with the
/// invocation's final response, or [`DEFAULT_LEASE_IDLE`] after its last
/// append; [`PgSessionService::with_invocation_lease`] changes that or
/// turns it off.
#[derive(Clone)]
pub struct PgSessionService {
    store: Arc<dyn SessionStore>,
    lease_idle: Option<Duration>,
    leases: LeaseBook,
}

impl std::fmt::Debug for PgSessionService {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgSessionService")
            .field("store", &self.store)
            .field("lease_idle", &self.lease_idle)
            .finish_non_exhaustive()
    }
}

impl PgSessionService {
    /// A service on `store`.
    pub fn new(store: Arc<dyn SessionStore>) -> Self {
        Self { store, lease_idle: Some(DEFAULT_LEASE_IDLE), leases: LeaseBook::default() }
    }

    /// How long an invocation's lease on a session outlives its last
    /// append; `None` turns the lease off, and concurrent invocations on one
    /// session then interleave their events, as adk's own services do.
    pub fn with_invocation_lease(mut self, idle: Option<Duration>) -> Self {
        self.lease_idle = idle;
        self
    }

    /// A service on an owned store.
    pub fn from_store(store: impl SessionStore + 'static) -> Self {
        Self::new(Arc::new(store))
    }

    /// Connects to PostgreSQL at `url` with the default pool and store
    /// settings. The schema must be migrated ([`crate::migrate`]).
    #[cfg(feature = "postgres")]
    pub async fn connect(url: &str) -> Result<Self> {
        Self::connect_with(
            url,
            &adk_postgres_storage::PoolConfig::default(),
            adk_postgres_domain::StoreConfig::default(),
        )
        .await
    }

    /// Connects with explicit pool settings and store settings (default
    /// TTL, maximum session lifetime).
    #[cfg(feature = "postgres")]
    pub async fn connect_with(
        url: &str,
        pool: &adk_postgres_storage::PoolConfig,
        config: adk_postgres_domain::StoreConfig,
    ) -> Result<Self> {
        let store = adk_postgres_storage::PgSessionStore::connect(url, pool, config).await.map_err(|e| {
            adk_core::AdkError::new(
                adk_core::ErrorComponent::Session,
                adk_core::ErrorCategory::Unavailable,
                codes::UNAVAILABLE,
                format!("connecting the session store failed: {e}"),
            )
            .with_source(e)
        })?;
        Ok(Self::from_store(store))
    }

    /// The store underneath, for what adk's trait does not reach:
    /// versions, rollover, paging tokens, expiry.
    pub fn store(&self) -> &Arc<dyn SessionStore> {
        &self.store
    }

    /// The full key for a bare session id: the store looks the id up across
    /// apps and users; an id two sessions share is refused, never guessed.
    async fn resolve(&self, session_id: &str) -> Result<SessionKey> {
        let id = SessionId::new(session_id).map_err(to_adk_error)?;
        let mut keys = self.store.find_by_id(&id, 2).await.map_err(to_adk_error)?;
        match keys.len() {
            0 => Err(not_found(codes::NOT_FOUND, format!("session '{session_id}' was not found"))),
            1 => Ok(keys.remove(0)),
            _ => Err(invalid(
                codes::AMBIGUOUS_ID,
                format!(
                    "session id '{session_id}' names several sessions (of different users or apps); address it \
                     by app, user and id (append_event_for_identity) instead"
                ),
            )),
        }
    }

    async fn append_to(&self, key: &SessionKey, event: Event) -> Result<()> {
        validate_keys("event.actions.state_delta", event.actions.state_delta.keys())?;
        // An event outside any invocation (one a program appends itself)
        // has nothing to hold the lease by, and is appended without it.
        let invocation = event.invocation_id.clone();
        let lease = self
            .lease_idle
            .filter(|_| !invocation.is_empty())
            .map(|idle| (idle, self.leases.request(key, &invocation, idle, ends_turn(&event))));
        let event = to_store_event(&event)?;
        let options = AppendOptions { lease: lease.map(|(_, request)| request), ..AppendOptions::default() };
        match self.store.append(key, event, options).await {
            Ok(appended) => {
                if let (Some((idle, _)), Some(grant)) = (lease, appended.lease) {
                    self.leases.granted(key, &invocation, idle, grant);
                }
                Ok(())
            }
            Err(error) => {
                if matches!(error, StoreError::LeaseLost { .. }) {
                    self.leases.forget(key, &invocation);
                }
                Err(to_adk_error(error))
            }
        }
    }

    async fn load_all(&self, key: &SessionKey) -> Result<adk_postgres_domain::Session> {
        self.store.get(key, GetOptions::default()).await.map_err(to_adk_error)
    }

    fn loaded(&self, session: adk_postgres_domain::Session) -> Result<Box<dyn Session>> {
        Ok(Box::new(LoadedSession::from_store(session)?))
    }

    /// Starts a new session of the same app and user from `identity`'s
    /// history up to and including `target_event_id`, as adk's `rewind`
    /// names its point: copies of those events and the session state they
    /// built. The original is untouched and the two diverge from here.
    /// `new_session_id` blank or absent gets a UUIDv4; a taken one is
    /// `session.already_exists`. Not part of adk's trait, so reached here.
    pub async fn fork(
        &self,
        identity: &adk_core::AdkIdentity,
        target_event_id: &str,
        new_session_id: Option<String>,
    ) -> Result<Box<dyn Session>> {
        let key = key_of(identity.app_name.as_ref(), identity.user_id.as_ref(), identity.session_id.as_ref())?;
        let current = self.load_all(&key).await?;
        let Some(position) = current.events.iter().position(|e| e.id == target_event_id) else {
            return Err(not_found(
                codes::EVENT_NOT_FOUND,
                format!("session '{}' has no event '{target_event_id}'", key.session_id),
            ));
        };
        let forked = self.store.fork(&key, position as u64 + 1, new_session_id).await.map_err(to_adk_error)?;
        self.loaded(forked)
    }

    /// Replaces one event's content, and any other text it carries, with a
    /// tombstone recording `reason` and the time, keeping the conversation
    /// (the store's `redact_event`). A missing event is
    /// `session.event_not_found`. Not part of adk's trait, so reached here.
    pub async fn redact_event(
        &self,
        identity: &adk_core::AdkIdentity,
        event_id: &str,
        reason: &str,
        options: adk_postgres_domain::RedactOptions,
    ) -> Result<()> {
        let key = key_of(identity.app_name.as_ref(), identity.user_id.as_ref(), identity.session_id.as_ref())?;
        self.store.redact_event(&key, event_id, reason, options).await.map_err(to_adk_error)?;
        Ok(())
    }
}

fn key_of(app_name: &str, user_id: &str, session_id: &str) -> Result<SessionKey> {
    SessionKey::parse(app_name, user_id, session_id).map_err(to_adk_error)
}

fn owner(app_name: &str, user_id: &str) -> Result<(AppName, UserId)> {
    Ok((AppName::new(app_name).map_err(to_adk_error)?, UserId::new(user_id).map_err(to_adk_error)?))
}

#[async_trait]
impl SessionService for PgSessionService {
    async fn create(&self, req: CreateRequest) -> Result<Box<dyn Session>> {
        let (app_name, user_id) = owner(&req.app_name, &req.user_id)?;
        validate_keys("state", req.state.keys())?;
        let mut request = CreateSession::new(app_name, user_id).with_state(to_store_state(&req.state));
        request.session_id = req.session_id;
        let session = self.store.create(request).await.map_err(to_adk_error)?;
        self.loaded(session)
    }

    async fn get(&self, req: GetRequest) -> Result<Box<dyn Session>> {
        let key = key_of(&req.app_name, &req.user_id, &req.session_id)?;
        let options = GetOptions { num_recent_events: req.num_recent_events, after: req.after };
        let session = self.store.get_json(&key, options).await.map_err(to_adk_error)?;
        Ok(Box::new(LoadedSession::from_json(session)?))
    }

    /// Newest first, live state, no events. `offset` walks keyset pages
    /// (cost grows with the offset); `limit: None` returns every session.
    async fn list(&self, req: ListRequest) -> Result<Vec<Box<dyn Session>>> {
        let (app_name, user_id) = owner(&req.app_name, &req.user_id)?;
        let mut skip = req.offset.unwrap_or(0);
        let mut wanted = req.limit.unwrap_or(usize::MAX);
        let mut request = ListSessions::new(app_name, user_id);
        let mut sessions: Vec<Box<dyn Session>> = Vec::new();
        while wanted > 0 {
            request.page_size = Some(skip.saturating_add(wanted).min(MAX_PAGE_SIZE));
            let page = self.store.list(&request).await.map_err(to_adk_error)?;
            for summary in page.sessions {
                if skip > 0 {
                    skip -= 1;
                } else if wanted > 0 {
                    wanted -= 1;
                    sessions.push(Box::new(LoadedSession::from_summary(summary)));
                }
            }
            match page.next_page_token {
                Some(token) => request.page_token = Some(token),
                None => break,
            }
        }
        Ok(sessions)
    }

    async fn delete(&self, req: DeleteRequest) -> Result<()> {
        let key = key_of(&req.app_name, &req.user_id, &req.session_id)?;
        self.store.delete(&key).await.map_err(to_adk_error)?;
        Ok(())
    }

    /// The bare id is looked up in the store (one indexed read); an id
    /// several sessions share is `session.ambiguous_id`, never a guess.
    /// `append_event_for_identity`, which the runner uses, needs no lookup.
    async fn append_event(&self, session_id: &str, event: Event) -> Result<()> {
        let key = self.resolve(session_id).await?;
        self.append_to(&key, event).await
    }

    async fn append_event_for_identity(&self, req: AppendEventRequest) -> Result<()> {
        let identity = &req.identity;
        let key = key_of(identity.app_name.as_ref(), identity.user_id.as_ref(), identity.session_id.as_ref())?;
        self.append_to(&key, req.event).await
    }

    /// Deletes every live session of the user, page by page; their events go
    /// with them, and app and user state stay (as `delete` does).
    async fn delete_all_sessions(&self, app_name: &str, user_id: &str) -> Result<()> {
        let (app_name, user_id) = owner(app_name, user_id)?;
        let mut request = ListSessions::new(app_name.clone(), user_id.clone());
        request.page_size = Some(MAX_PAGE_SIZE);
        let mut deleted = HashSet::new();
        loop {
            // Always the first page: what was deleted no longer shows.
            let page = self.store.list(&request).await.map_err(to_adk_error)?;
            if page.sessions.is_empty() {
                break;
            }
            for summary in &page.sessions {
                // A session listed again after its delete succeeded would
                // make this loop endless; report it instead.
                if !deleted.insert(summary.key.clone()) {
                    return Err(adk_core::AdkError::internal(
                        adk_core::ErrorComponent::Session,
                        codes::DATABASE,
                        format!("session {} is still listed after it was deleted", summary.key),
                    ));
                }
                self.store.delete(&summary.key).await.map_err(to_adk_error)?;
            }
        }
        Ok(())
    }

    /// Keeps the events up to and including `target_event_id`, rebuilds the
    /// session state from their deltas; app and user state are not rewound.
    /// Atomic: one store call truncates the log and rebuilds the state.
    async fn rewind(&self, session_id: &str, target_event_id: &str) -> Result<Box<dyn Session>> {
        let key = self.resolve(session_id).await?;
        let current = self.load_all(&key).await?;
        let Some(position) = current.events.iter().position(|e| e.id == target_event_id) else {
            return Err(not_found(
                codes::EVENT_NOT_FOUND,
                format!("session '{session_id}' has no event '{target_event_id}'"),
            ));
        };
        let session =
            self.store.rewind(&key, position as u64 + 1, Some(current.version)).await.map_err(to_adk_error)?;
        self.loaded(session)
    }

    /// Drops the last `steps` events (0 changes nothing; more than the
    /// session holds is `session.rewind_out_of_range`).
    async fn rewind_steps(&self, session_id: &str, steps: usize) -> Result<Box<dyn Session>> {
        let key = self.resolve(session_id).await?;
        let current = self.load_all(&key).await?;
        if steps == 0 {
            return self.loaded(current);
        }
        let held = current.events.len();
        if steps > held {
            return Err(invalid(
                codes::REWIND_OUT_OF_RANGE,
                format!("cannot rewind {steps} steps: session '{session_id}' holds {held} events"),
            ));
        }
        let session =
            self.store.rewind(&key, (held - steps) as u64, Some(current.version)).await.map_err(to_adk_error)?;
        self.loaded(session)
    }

    /// One cheap read through the pool: a listing of a user that has no
    /// sessions. Fails with the store's error when the database is not
    /// reachable.
    async fn health_check(&self) -> Result<()> {
        let (app_name, user_id) = owner("adk-postgres.health", "probe")?;
        let mut request = ListSessions::new(app_name, user_id);
        request.page_size = Some(1);
        self.store.list(&request).await.map_err(to_adk_error)?;
        Ok(())
    }
}
