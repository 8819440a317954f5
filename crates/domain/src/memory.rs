//! An in-memory store with exactly the contract of the Postgres store. It is
//! the reference the conformance suite holds both to, and a stand-in for
//! unit tests of code that consumes a `SessionStore`.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Mutex, MutexGuard};

use async_trait::async_trait;
use chrono::{DateTime, DurationRound, TimeDelta, Utc};

use crate::app_list::{AppPageToken, AppSessionPage, ListAppSessions};
use crate::error::StoreError;
use crate::event::Event;
use crate::ids::{AppName, SessionId, SessionKey, UserId};
use crate::lease::LeaseState;
use crate::metadata::{SessionMetadata, labels_match};
use crate::paging::{EventPage, EventsPage};
use crate::policy::StorePolicy;
use crate::redaction::{RedactOptions, Redacted, check_event_id, check_reason};
use crate::session::{
    AppendOptions, Appended, CreateSession, Erasure, GetOptions, ListSessions, OnExisting, PageToken, Session,
    SessionPage, SessionSummary, StoreConfig,
};
use crate::state::{MAX_STATE_BYTES, ScopedState, State, apply_delta, check_scope_delta, json_size, merge_scopes};
use crate::store::SessionStore;

#[derive(Debug, Clone)]
struct StoredSession {
    state: State,
    /// The session-scoped state it was created (or rolled over) with; rewind
    /// replays event deltas on top of it.
    initial_state: State,
    events: Vec<Event>,
    last_seq: u64,
    created_at: DateTime<Utc>,
    updated_at: DateTime<Utc>,
    expires_at: Option<DateTime<Utc>>,
    closed_at: Option<DateTime<Utc>>,
    successor: Option<SessionId>,
    metadata: SessionMetadata,
    lease: LeaseState,
}

impl StoredSession {
    fn is_live(&self, now: DateTime<Utc>) -> bool {
        self.expires_at.is_none_or(|at| at > now)
    }
}

#[derive(Debug, Default)]
struct Tables {
    sessions: BTreeMap<SessionKey, StoredSession>,
    user_states: HashMap<(AppName, UserId), State>,
    app_states: HashMap<AppName, State>,
}

impl Tables {
    /// A listing's view of a stored session: live state, no events.
    fn summary(&self, key: &SessionKey, s: &StoredSession) -> SessionSummary {
        SessionSummary {
            key: key.clone(),
            state: self.merged_state(key, &s.state),
            version: s.last_seq,
            last_update_time: s.updated_at,
            created_at: s.created_at,
            expires_at: s.expires_at,
            metadata: s.metadata.clone(),
        }
    }

    fn merged_state(&self, key: &SessionKey, session: &State) -> State {
        let empty = State::new();
        let user = self.user_states.get(&(key.app_name.clone(), key.user_id.clone())).unwrap_or(&empty);
        let app = self.app_states.get(&key.app_name).unwrap_or(&empty);
        merge_scopes(session, user, app)
    }

    /// Applies app and user deltas, refusing (and writing nothing) when a
    /// merged scope would pass the size cap.
    fn check_and_apply_shared(&mut self, field: &str, key: &SessionKey, delta: &ScopedState) -> Result<(), StoreError> {
        let user_key = (key.app_name.clone(), key.user_id.clone());
        let mut user = self.user_states.get(&user_key).cloned().unwrap_or_default();
        let mut app = self.app_states.get(&key.app_name).cloned().unwrap_or_default();
        apply_delta(&mut user, &delta.user);
        apply_delta(&mut app, &delta.app);
        for (scope, state) in [("user", &user), ("app", &app)] {
            let size = json_size(state);
            if size > MAX_STATE_BYTES {
                return Err(StoreError::StateTooLarge {
                    field: format!("{field} ({scope} scope)"),
                    size: Some(size),
                    limit: MAX_STATE_BYTES,
                });
            }
        }
        if !delta.user.is_empty() {
            self.user_states.insert(user_key, user);
        }
        if !delta.app.is_empty() {
            self.app_states.insert(key.app_name.clone(), app);
        }
        Ok(())
    }
}

/// `stored` with `delta` applied, refused (nothing written) when the merged
/// scope would pass the size cap, as an append's shared delta is.
fn merged_scope(stored: Option<&State>, delta: &State, scope: &str) -> Result<State, StoreError> {
    let mut state = stored.cloned().unwrap_or_default();
    apply_delta(&mut state, delta);
    let size = json_size(&state);
    if size > MAX_STATE_BYTES {
        return Err(StoreError::StateTooLarge {
            field: format!("delta ({scope} scope)"),
            size: Some(size),
            limit: MAX_STATE_BYTES,
        });
    }
    Ok(state)
}

/// The reference store. Cheap to create; every instance is independent.
#[derive(Debug, Default)]
pub struct InMemoryStore {
    config: StoreConfig,
    /// What the database's policy row is to the Postgres store.
    policy: StorePolicy,
    tables: Mutex<Tables>,
}

/// PostgreSQL keeps microseconds; the reference store does too, so both
/// report the same update times and page tokens.
fn now_micros() -> DateTime<Utc> {
    let now = Utc::now();
    now.duration_trunc(TimeDelta::microseconds(1)).unwrap_or(now)
}

fn ttl_deadline(now: DateTime<Utc>, ttl: std::time::Duration) -> Result<DateTime<Utc>, StoreError> {
    TimeDelta::from_std(ttl)
        .ok()
        .and_then(|ttl| now.checked_add_signed(ttl))
        .ok_or_else(|| StoreError::invalid("ttl", "too long"))
}

impl InMemoryStore {
    /// An empty store with the default config and policy.
    pub fn new() -> Self {
        Self::default()
    }

    /// An empty store with `config` and the default policy.
    pub fn with_config(config: StoreConfig) -> Self {
        Self { config, policy: StorePolicy::default(), tables: Mutex::default() }
    }

    /// The same store held to `policy` instead of the default one; a
    /// client's config can still only tighten it.
    pub fn with_policy(mut self, policy: StorePolicy) -> Result<Self, StoreError> {
        policy.validate()?;
        self.policy = policy;
        Ok(self)
    }

    fn tables(&self) -> MutexGuard<'_, Tables> {
        // A panic elsewhere cannot leave the maps half-updated: every writer
        // checks before it mutates, so the data behind a poisoned lock is sound.
        self.tables.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn load(tables: &Tables, key: &SessionKey, options: GetOptions) -> Result<Session, StoreError> {
        let stored = tables
            .sessions
            .get(key)
            .filter(|s| s.is_live(Utc::now()))
            .ok_or_else(|| StoreError::NotFound(key.clone()))?;
        let mut events: Vec<Event> = match options.after {
            Some(after) => stored.events.iter().filter(|e| e.timestamp >= after).cloned().collect(),
            None => stored.events.clone(),
        };
        if let Some(n) = options.num_recent_events {
            let skip = events.len().saturating_sub(n);
            events.drain(..skip);
        }
        Ok(Session {
            key: key.clone(),
            state: tables.merged_state(key, &stored.state),
            events,
            version: stored.last_seq,
            last_update_time: stored.updated_at,
            created_at: stored.created_at,
            expires_at: stored.expires_at,
            closed_at: stored.closed_at,
            successor: stored.successor.clone(),
            metadata: stored.metadata.clone(),
        })
    }
}

#[async_trait]
impl SessionStore for InMemoryStore {
    async fn create(&self, request: CreateSession) -> Result<Session, StoreError> {
        let id = SessionId::from_requested(request.session_id.as_deref())?;
        request.metadata.validate()?;
        let scoped = ScopedState::split("state", &request.state)?;
        scoped.check_sizes("state")?;
        let key = SessionKey::new(request.app_name, request.user_id, id);
        let now = now_micros();
        let expires_at = self
            .policy
            .effective_ttl(request.ttl.or(self.config.default_ttl))
            .map(|ttl| ttl_deadline(now, ttl))
            .transpose()?;

        let mut tables = self.tables();
        // An expired session's id is free at once: it is replaced.
        if tables.sessions.get(&key).is_some_and(|s| !s.is_live(now)) {
            tables.sessions.remove(&key);
        }
        if tables.sessions.contains_key(&key) {
            return match request.on_existing {
                OnExisting::ReturnExisting => {
                    Self::load(&tables, &key, GetOptions::default()).map_err(|_| StoreError::AlreadyExists(key))
                }
                OnExisting::Fail => Err(StoreError::AlreadyExists(key)),
            };
        }
        tables.check_and_apply_shared("state", &key, &scoped)?;
        tables.sessions.insert(
            key.clone(),
            StoredSession {
                initial_state: scoped.session.clone(),
                state: scoped.session,
                events: Vec::new(),
                last_seq: 0,
                created_at: now,
                updated_at: now,
                expires_at,
                closed_at: None,
                successor: None,
                metadata: request.metadata,
                lease: LeaseState::default(),
            },
        );
        Self::load(&tables, &key, GetOptions::default())
    }

    async fn get(&self, key: &SessionKey, options: GetOptions) -> Result<Session, StoreError> {
        Self::load(&self.tables(), key, options)
    }

    async fn list(&self, request: &ListSessions) -> Result<SessionPage, StoreError> {
        request.validate_filters()?;
        let cursor = request.page_token.as_ref().map(PageToken::position).transpose()?;
        let page_size = request.effective_page_size();
        let now = Utc::now();
        let tables = self.tables();
        let mut rows: Vec<(&SessionKey, &StoredSession)> = tables
            .sessions
            .iter()
            .filter(|(k, s)| k.app_name == request.app_name && k.user_id == request.user_id && s.is_live(now))
            .filter(|(_, s)| labels_match(&s.metadata.labels, &request.labels))
            .filter(|(_, s)| request.updated_after.is_none_or(|after| s.updated_at >= after))
            .filter(|(_, s)| request.updated_before.is_none_or(|before| s.updated_at < before))
            .filter(|(k, s)| match &cursor {
                Some((micros, id)) => (s.updated_at.timestamp_micros(), &k.session_id) < (*micros, id),
                None => true,
            })
            .collect();
        rows.sort_by(|(ka, a), (kb, b)| (b.updated_at, &kb.session_id).cmp(&(a.updated_at, &ka.session_id)));
        let more = rows.len() > page_size;
        rows.truncate(page_size);
        let next_page_token = if more {
            rows.last().map(|(k, s)| PageToken::after(s.updated_at.timestamp_micros(), &k.session_id))
        } else {
            None
        };
        let sessions = rows.into_iter().map(|(key, s)| tables.summary(key, s)).collect();
        Ok(SessionPage { sessions, next_page_token })
    }

    async fn delete(&self, key: &SessionKey) -> Result<(), StoreError> {
        self.tables().sessions.remove(key);
        Ok(())
    }

    async fn append(&self, key: &SessionKey, event: Event, options: AppendOptions) -> Result<Appended, StoreError> {
        if event.is_partial() {
            return Ok(Appended { event, seq: None, replayed: false, last_update_time: None, lease: None });
        }
        if let Some(lease) = &options.lease {
            lease.validate(&event.invocation_id)?;
        }
        let (event, prepared) = event.prepare_for_store_with(self.config.media_offload_bytes())?;
        let now = now_micros();
        let mut tables = self.tables();
        let stored =
            tables.sessions.get(key).filter(|s| s.is_live(now)).ok_or_else(|| StoreError::NotFound(key.clone()))?;

        if let Some(pos) = stored.events.iter().position(|e| e.id == event.id) {
            let prior = &stored.events[pos];
            // As stored, media inline: the payload has references instead.
            let same = serde_json::to_value(prior).ok() == serde_json::to_value(&event).ok();
            if !same {
                return Err(StoreError::DuplicateEvent { key: key.clone(), event_id: event.id });
            }
            return Ok(Appended {
                event: prior.clone(),
                seq: Some(pos as u64 + 1),
                replayed: true,
                last_update_time: Some(stored.updated_at),
                lease: None,
            });
        }
        if stored.closed_at.is_some() {
            return Err(StoreError::SessionClosed { key: key.clone(), successor: stored.successor.clone() });
        }
        let max_lifetime = self.policy.effective_lifetime(self.config.max_session_lifetime);
        if ttl_deadline(stored.created_at, max_lifetime).is_ok_and(|end| end <= now) {
            return Err(StoreError::LifetimeExceeded { key: key.clone(), max_lifetime });
        }
        let lease =
            options.lease.map(|request| stored.lease.admit(key, &event.invocation_id, &request, now)).transpose()?;
        if let Some(expected) = options.expected_version
            && expected != stored.last_seq
        {
            return Err(StoreError::StaleSession { key: key.clone(), expected, actual: stored.last_seq });
        }
        let mut session_state = stored.state.clone();
        apply_delta(&mut session_state, &prepared.delta.session);
        let size = json_size(&session_state);
        if size > MAX_STATE_BYTES {
            return Err(StoreError::StateTooLarge {
                field: "event.actions.state_delta (session scope)".into(),
                size: Some(size),
                limit: MAX_STATE_BYTES,
            });
        }
        tables.check_and_apply_shared("event.actions.state_delta", key, &prepared.delta)?;

        let stored = tables.sessions.get_mut(key).ok_or_else(|| StoreError::NotFound(key.clone()))?;
        stored.state = session_state;
        stored.last_seq += 1;
        stored.updated_at = stored.updated_at.max(now);
        stored.events.push(event.clone());
        let granted = lease.map(|lease| {
            let grant = lease.grant();
            stored.lease = lease;
            grant
        });
        Ok(Appended {
            event,
            seq: Some(stored.last_seq),
            replayed: false,
            last_update_time: Some(stored.updated_at),
            lease: granted,
        })
    }

    async fn rollover(
        &self,
        key: &SessionKey,
        successor_id: Option<String>,
        summary: Event,
    ) -> Result<Session, StoreError> {
        let successor_id = SessionId::from_requested(successor_id.as_deref())?;
        let (summary, _) = summary.prepare_summary()?;
        let successor = SessionKey::new(key.app_name.clone(), key.user_id.clone(), successor_id.clone());
        let now = now_micros();
        let mut tables = self.tables();
        let old =
            tables.sessions.get(key).filter(|s| s.is_live(now)).ok_or_else(|| StoreError::NotFound(key.clone()))?;
        if old.closed_at.is_some() {
            // A retry whose first reply was lost finds its own rollover done.
            if old.successor.as_ref() == Some(&successor_id) {
                return Self::load(&tables, &successor, GetOptions::default());
            }
            return Err(StoreError::SessionClosed { key: key.clone(), successor: old.successor.clone() });
        }
        if tables.sessions.contains_key(&successor) {
            return Err(StoreError::AlreadyExists(successor));
        }
        let state = old.state.clone();
        let metadata = old.metadata.clone();
        let expires_at =
            self.policy.effective_ttl(self.config.default_ttl).map(|ttl| ttl_deadline(now, ttl)).transpose()?;
        if let Some(old) = tables.sessions.get_mut(key) {
            old.closed_at = Some(now);
            old.successor = Some(successor_id);
            old.updated_at = old.updated_at.max(now);
        }
        tables.sessions.insert(
            successor.clone(),
            StoredSession {
                initial_state: state.clone(),
                state,
                events: vec![summary],
                last_seq: 1,
                created_at: now,
                updated_at: now,
                expires_at,
                closed_at: None,
                successor: None,
                metadata,
                lease: LeaseState::default(),
            },
        );
        Self::load(&tables, &successor, GetOptions::default())
    }

    async fn find_by_id(&self, session_id: &SessionId, limit: usize) -> Result<Vec<SessionKey>, StoreError> {
        let now = Utc::now();
        Ok(self
            .tables()
            .sessions
            .iter()
            .filter(|(k, s)| &k.session_id == session_id && s.is_live(now))
            .map(|(k, _)| k.clone())
            .take(limit)
            .collect())
    }

    async fn rewind(&self, key: &SessionKey, keep: u64, expected_version: Option<u64>) -> Result<Session, StoreError> {
        let now = now_micros();
        let mut tables = self.tables();
        let stored =
            tables.sessions.get_mut(key).filter(|s| s.is_live(now)).ok_or_else(|| StoreError::NotFound(key.clone()))?;
        // Already at the target (a retry whose first reply was lost, or a
        // rewind to the current version): nothing to do, and a success.
        if keep == stored.last_seq {
            return Self::load(&tables, key, GetOptions::default());
        }
        if let Some(expected) = expected_version
            && expected != stored.last_seq
        {
            return Err(StoreError::StaleSession { key: key.clone(), expected, actual: stored.last_seq });
        }
        if keep > stored.last_seq {
            return Err(StoreError::invalid("keep", format!("the session has only {} events", stored.last_seq)));
        }
        stored.events.truncate(usize::try_from(keep).unwrap_or(usize::MAX));
        let mut state = stored.initial_state.clone();
        for event in &stored.events {
            let scoped = ScopedState::split("event.actions.state_delta", &event.actions.state_delta)?;
            apply_delta(&mut state, &scoped.session);
        }
        stored.state = state;
        stored.last_seq = keep;
        stored.updated_at = stored.updated_at.max(now);
        Self::load(&tables, key, GetOptions::default())
    }

    async fn set_metadata(&self, key: &SessionKey, metadata: SessionMetadata) -> Result<(), StoreError> {
        metadata.validate()?;
        let now = Utc::now();
        let mut tables = self.tables();
        let stored =
            tables.sessions.get_mut(key).filter(|s| s.is_live(now)).ok_or_else(|| StoreError::NotFound(key.clone()))?;
        stored.metadata = metadata;
        Ok(())
    }

    async fn erase_user(&self, app: &AppName, user: &UserId) -> Result<Erasure, StoreError> {
        let mut tables = self.tables();
        let mut erasure = Erasure::default();
        tables.sessions.retain(|key, stored| {
            let erased = &key.app_name == app && &key.user_id == user;
            if erased {
                erasure.sessions += 1;
                erasure.events += stored.events.len() as u64;
            }
            !erased
        });
        erasure.user_state = tables.user_states.remove(&(app.clone(), user.clone())).is_some();
        Ok(erasure)
    }

    async fn fork(&self, key: &SessionKey, at_seq: u64, new_id: Option<String>) -> Result<Session, StoreError> {
        let new_id = SessionId::from_requested(new_id.as_deref())?;
        let fork_key = SessionKey::new(key.app_name.clone(), key.user_id.clone(), new_id);
        let now = now_micros();
        let expires_at =
            self.policy.effective_ttl(self.config.default_ttl).map(|ttl| ttl_deadline(now, ttl)).transpose()?;
        let mut tables = self.tables();
        let original =
            tables.sessions.get(key).filter(|s| s.is_live(now)).ok_or_else(|| StoreError::NotFound(key.clone()))?;
        if at_seq > original.last_seq {
            return Err(StoreError::invalid("at_seq", format!("the session has only {} events", original.last_seq)));
        }
        let events: Vec<Event> =
            original.events.iter().take(usize::try_from(at_seq).unwrap_or(usize::MAX)).cloned().collect();
        let mut state = original.initial_state.clone();
        for event in &events {
            let scoped = ScopedState::split("event.actions.state_delta", &event.actions.state_delta)?;
            apply_delta(&mut state, &scoped.session);
        }
        let forked = StoredSession {
            initial_state: original.initial_state.clone(),
            state,
            events,
            last_seq: at_seq,
            created_at: now,
            updated_at: now,
            expires_at,
            closed_at: None,
            successor: None,
            metadata: original.metadata.clone(),
            lease: LeaseState::default(),
        };
        // An expired session's id is free at once, as for create.
        if tables.sessions.get(&fork_key).is_some_and(|s| s.is_live(now)) {
            return Err(StoreError::AlreadyExists(fork_key));
        }
        tables.sessions.insert(fork_key.clone(), forked);
        Self::load(&tables, &fork_key, GetOptions::default())
    }

    async fn redact_event(
        &self,
        key: &SessionKey,
        event_id: &str,
        reason: &str,
        options: RedactOptions,
    ) -> Result<Redacted, StoreError> {
        check_event_id(event_id)?;
        check_reason(reason)?;
        let now = now_micros();
        let mut tables = self.tables();
        let stored =
            tables.sessions.get_mut(key).filter(|s| s.is_live(now)).ok_or_else(|| StoreError::NotFound(key.clone()))?;
        let pos = stored
            .events
            .iter()
            .position(|e| e.id == event_id)
            .ok_or_else(|| StoreError::EventNotFound { key: key.clone(), event_id: event_id.to_owned() })?;
        let seq = pos as u64 + 1;
        let event = &mut stored.events[pos];
        if event.redaction_covers(options) {
            return Ok(Redacted { seq, event: event.clone(), already_redacted: true });
        }
        *event = event.clone().redacted(reason, now, options);
        Ok(Redacted { seq, event: event.clone(), already_redacted: false })
    }

    async fn get_user_state(&self, app: &AppName, user: &UserId) -> Result<State, StoreError> {
        Ok(self.tables().user_states.get(&(app.clone(), user.clone())).cloned().unwrap_or_default())
    }

    async fn get_app_state(&self, app: &AppName) -> Result<State, StoreError> {
        Ok(self.tables().app_states.get(app).cloned().unwrap_or_default())
    }

    async fn merge_user_state(&self, app: &AppName, user: &UserId, delta: State) -> Result<State, StoreError> {
        check_scope_delta("delta", "user", &delta)?;
        let key = (app.clone(), user.clone());
        let mut tables = self.tables();
        let merged = merged_scope(tables.user_states.get(&key), &delta, "user")?;
        if !delta.is_empty() {
            tables.user_states.insert(key, merged.clone());
        }
        Ok(merged)
    }

    async fn merge_app_state(&self, app: &AppName, delta: State) -> Result<State, StoreError> {
        check_scope_delta("delta", "app", &delta)?;
        let mut tables = self.tables();
        let merged = merged_scope(tables.app_states.get(app), &delta, "app")?;
        if !delta.is_empty() {
            tables.app_states.insert(app.clone(), merged.clone());
        }
        Ok(merged)
    }

    async fn list_events(&self, key: &SessionKey, page: EventPage) -> Result<EventsPage, StoreError> {
        page.validate()?;
        let tables = self.tables();
        let stored = tables
            .sessions
            .get(key)
            .filter(|s| s.is_live(Utc::now()))
            .ok_or_else(|| StoreError::NotFound(key.clone()))?;
        Ok(crate::paging::select(&stored.events, page, stored.last_seq))
    }

    async fn list_app_sessions(&self, request: &ListAppSessions) -> Result<AppSessionPage, StoreError> {
        request.validate_filters()?;
        let cursor = request.page_token.as_ref().map(AppPageToken::position).transpose()?;
        let page_size = request.effective_page_size();
        let now = Utc::now();
        let tables = self.tables();
        let position = |k: &SessionKey, s: &StoredSession| {
            (s.created_at.timestamp_micros(), k.user_id.clone(), k.session_id.clone())
        };
        let mut rows: Vec<(&SessionKey, &StoredSession)> = tables
            .sessions
            .iter()
            .filter(|(k, s)| k.app_name == request.app_name && s.is_live(now))
            .filter(|(_, s)| labels_match(&s.metadata.labels, &request.labels))
            .filter(|(_, s)| request.updated_after.is_none_or(|after| s.updated_at >= after))
            .filter(|(_, s)| request.updated_before.is_none_or(|before| s.updated_at < before))
            .filter(|(k, s)| match &cursor {
                Some(at) => position(k, s) < (at.created_micros, at.user_id.clone(), at.session_id.clone()),
                None => true,
            })
            .collect();
        rows.sort_by_key(|(k, s)| std::cmp::Reverse(position(k, s)));
        let more = rows.len() > page_size;
        rows.truncate(page_size);
        let next_page_token = if more {
            rows.last().map(|(k, s)| AppPageToken::after(s.created_at.timestamp_micros(), &k.user_id, &k.session_id))
        } else {
            None
        };
        let sessions = rows.into_iter().map(|(key, s)| tables.summary(key, s)).collect();
        Ok(AppSessionPage { sessions, next_page_token })
    }
}
