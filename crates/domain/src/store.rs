//! The contract every session store implements: the Postgres store in
//! `adk-postgres-storage`, the in-memory reference store here, and anything
//! a test wants to put in their place.

use async_trait::async_trait;

use crate::app_list::{AppSessionPage, ListAppSessions};
use crate::error::StoreError;
use crate::event::Event;
use crate::ids::{AppName, SessionId, SessionKey, UserId};
use crate::json_events::{JsonEvents, JsonSession};
use crate::metadata::SessionMetadata;
use crate::paging::{EventPage, EventsPage};
use crate::redaction::{RedactOptions, Redacted};
use crate::session::{AppendOptions, Appended, CreateSession, Erasure, GetOptions, ListSessions, Session, SessionPage};
use crate::state::State;

/// A durable home for ADK sessions, their events and their scoped state.
#[async_trait]
pub trait SessionStore: Send + Sync + std::fmt::Debug {
    /// Creates a session. A taken id is `AlreadyExists` (or, with
    /// `OnExisting::ReturnExisting`, the existing session); never an
    /// overwrite. Initial state is routed by prefix; `temp:` is dropped.
    async fn create(&self, request: CreateSession) -> Result<Session, StoreError>;

    /// Loads a session with its merged state and the events `options` select.
    /// Missing, another user's or expired sessions are `NotFound`.
    async fn get(&self, key: &SessionKey, options: GetOptions) -> Result<Session, StoreError>;

    /// [`get`](Self::get) with the events as their stored JSON, for a caller
    /// that decodes them into its own types. The default serializes what
    /// `get` returns; a store holding JSON hands it over as it is.
    async fn get_json(&self, key: &SessionKey, options: GetOptions) -> Result<JsonSession, StoreError> {
        let mut session = self.get(key, options).await?;
        let events = JsonEvents::from_events(&std::mem::take(&mut session.events))?;
        Ok(JsonSession { session, events })
    }

    /// One page of a user's sessions, newest first, without events.
    async fn list(&self, request: &ListSessions) -> Result<SessionPage, StoreError>;

    /// Deletes a session and its events; app and user state stay. Deleting a
    /// missing session succeeds, so retries are safe.
    async fn delete(&self, key: &SessionKey) -> Result<(), StoreError>;

    /// Appends an event and applies its state delta atomically, assigning the
    /// next gapless sequence number. Partial events are returned unstored.
    async fn append(&self, key: &SessionKey, event: Event, options: AppendOptions) -> Result<Appended, StoreError>;

    /// Closes a session and opens its successor atomically: a new id
    /// (`successor_id`, or a generated one), the closed session's
    /// session-scoped state, today's partition, and `summary` as its first
    /// event. Later appends to the closed session fail with `SessionClosed`.
    /// This is how a conversation outlives the maximum session lifetime.
    async fn rollover(
        &self,
        key: &SessionKey,
        successor_id: Option<String>,
        summary: Event,
    ) -> Result<Session, StoreError>;

    /// The live sessions with this id across all apps and users, at most
    /// `limit` of them (two are enough to tell an ambiguous id). For callers
    /// that know only a session id, as adk's `append_event` does.
    async fn find_by_id(&self, session_id: &SessionId, limit: usize) -> Result<Vec<SessionKey>, StoreError>;

    /// Keeps the first `keep` events of a session and forgets the rest,
    /// atomically: the session-scoped state is rebuilt from the kept events'
    /// deltas and the version becomes `keep`. App and user state, shared
    /// with other sessions, stay as they are. `keep` past the last event is
    /// `InvalidInput`; a differing `expected_version` is `StaleSession`.
    async fn rewind(&self, key: &SessionKey, keep: u64, expected_version: Option<u64>) -> Result<Session, StoreError>;

    /// Replaces a session's display name and labels. Not an append: the
    /// version and the last update time stay, and a closed session may still
    /// be renamed. Missing or expired sessions are `NotFound`.
    async fn set_metadata(&self, key: &SessionKey, metadata: SessionMetadata) -> Result<(), StoreError>;

    /// Erases a user of an app: every session (expired ones too), their
    /// events and the user's state, leaving an audit record without content.
    /// App state stays. Safe to interrupt and run again; erasing a user with
    /// nothing stored succeeds with zero counts.
    async fn erase_user(&self, app: &AppName, user: &UserId) -> Result<Erasure, StoreError>;

    /// Starts a new session of the same app and user from the first `at_seq`
    /// events of `key`: copies of those events (same ids, same `seq`), and
    /// session state rebuilt from the original's initial state plus their
    /// deltas. The display name and labels are copied. Atomic; afterwards the
    /// two diverge independently. `at_seq` past the last event is
    /// `InvalidInput`; a taken `new_id` is `AlreadyExists`.
    async fn fork(&self, key: &SessionKey, at_seq: u64, new_id: Option<String>) -> Result<Session, StoreError>;

    /// Replaces one event's content, and every other field that can carry
    /// text, with a tombstone recording `reason` and the time
    /// ([`crate::redaction`] says what is kept). The seq, id, author and
    /// timestamps stay, and the state delta too unless `options` says
    /// otherwise; the session's state, version and update time do not move.
    /// Every read (get, the change feed, fork, rewind) then sees the
    /// tombstone. Writes an audit row without content. A second redaction
    /// changes nothing and answers `already_redacted`, unless it removes the
    /// state delta the first kept. A bad `reason` or `event_id` is
    /// `InvalidInput` naming it; a missing session is `NotFound`, a missing
    /// event `EventNotFound`; nothing is written then.
    async fn redact_event(
        &self,
        key: &SessionKey,
        event_id: &str,
        reason: &str,
        options: RedactOptions,
    ) -> Result<Redacted, StoreError>;

    /// The user's `user:` state in `app`, keys without their prefix (as
    /// stored), read without a session. A user with none reads as `{}`.
    async fn get_user_state(&self, app: &AppName, user: &UserId) -> Result<State, StoreError>;

    /// The app's `app:` state, keys without their prefix, read without a
    /// session. An app with none reads as `{}`.
    async fn get_app_state(&self, app: &AppName) -> Result<State, StoreError>;

    /// Merges `delta` into the user's state atomically and returns the state
    /// after the merge. The semantics are exactly those of the `user:` part
    /// of an append's delta: shallow (a value replaces, JSON null is
    /// stored), under the row lock an append takes, so neither loses the
    /// other's update. Keys are the scope's own, without prefix: a prefixed
    /// key (`app:`, `user:`, `temp:`), an invalid key or a NUL is
    /// `InvalidInput` naming `delta[key]`; a merged state over the size cap
    /// is `StateTooLarge` (`delta (user scope)`); nothing is written then.
    /// An empty delta writes nothing and returns the current state. There is
    /// no such setter for session state: it is written by events only, so
    /// that `rewind` and `fork` can rebuild it from them.
    async fn merge_user_state(&self, app: &AppName, user: &UserId, delta: State) -> Result<State, StoreError>;

    /// [`SessionStore::merge_user_state`] for the app's state, shared by all
    /// of its users (`delta (app scope)` in a size error).
    async fn merge_app_state(&self, app: &AppName, delta: State) -> Result<State, StoreError>;

    /// One page of a session's events without loading the session
    /// ([`crate::paging`]): forward from the start or after a `seq`,
    /// backward from the end or before one, in ascending `seq` order, with
    /// the session's version, all in one snapshot. A limit outside
    /// 1..=[`crate::paging::MAX_EVENT_PAGE`] is `InvalidInput` naming
    /// `limit`, with nothing read; a missing, expired or other user's
    /// session is `NotFound`.
    async fn list_events(&self, key: &SessionKey, page: EventPage) -> Result<EventsPage, StoreError>;

    /// One page of an app's live sessions across its users, newest created
    /// first, without events ([`crate::app_list`]), with the user listing's
    /// filters. For the store's owner and roles bound to the app; any other
    /// role is refused with `PermissionDenied`.
    async fn list_app_sessions(&self, request: &ListAppSessions) -> Result<AppSessionPage, StoreError>;
}
