//! Sessions and the requests and answers of the store's operations.

use std::collections::BTreeMap;
use std::time::Duration;

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use chrono::{DateTime, Datelike, Utc};

use crate::error::StoreError;
use crate::event::Event;
use crate::ids::{AppName, SessionId, SessionKey, UserId};
use crate::lease::{InvocationLease, LeaseGrant};
use crate::metadata::{SessionMetadata, validate_labels};
use crate::state::State;

/// A session as `get` returns it.
#[derive(Debug, Clone, PartialEq)]
pub struct Session {
    /// Which session this is.
    pub key: SessionKey,
    /// Session state merged with the live app and user state, prefixes restored.
    pub state: State,
    /// Events in append order, filtered by the `GetOptions`.
    pub events: Vec<Event>,
    /// The number of events ever appended (`last_seq`); pass it back as the
    /// expected version to detect concurrent appends.
    pub version: u64,
    /// When the session last changed: created, appended to, rewound or
    /// closed. Metadata edits do not move it.
    pub last_update_time: DateTime<Utc>,
    /// When it was created.
    pub created_at: DateTime<Utc>,
    /// When it expires and reads stop finding it; `None` means never.
    pub expires_at: Option<DateTime<Utc>>,
    /// Set when the session was closed by a rollover.
    pub closed_at: Option<DateTime<Utc>>,
    /// The session the rollover moved the conversation to; set with
    /// `closed_at`.
    pub successor: Option<SessionId>,
    /// Display name and labels; not part of the conversation.
    pub metadata: SessionMetadata,
}

/// A session's metadata as `list` returns it: never events.
#[derive(Debug, Clone, PartialEq)]
pub struct SessionSummary {
    /// Which session this is.
    pub key: SessionKey,
    /// Session state merged with the live app and user state.
    pub state: State,
    /// The number of events ever appended, as in [`Session::version`].
    pub version: u64,
    /// When the session last changed, as in [`Session::last_update_time`].
    pub last_update_time: DateTime<Utc>,
    /// When it was created.
    pub created_at: DateTime<Utc>,
    /// When it expires; `None` means never.
    pub expires_at: Option<DateTime<Utc>>,
    /// Display name and labels.
    pub metadata: SessionMetadata,
}

/// What a create does when the id is taken.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum OnExisting {
    /// Fail with `AlreadyExists`; never overwrite.
    #[default]
    Fail,
    /// Return the existing session when it belongs to the same app and user:
    /// makes a retried create with a fixed id idempotent.
    ReturnExisting,
}

/// A create request.
#[derive(Debug, Clone)]
pub struct CreateSession {
    /// The app the session belongs to.
    pub app_name: AppName,
    /// The user the session belongs to.
    pub user_id: UserId,
    /// Trimmed; blank or absent means a generated UUIDv4.
    pub session_id: Option<String>,
    /// Initial state, routed by prefix like any delta.
    pub state: State,
    /// What to do when `session_id` is taken.
    pub on_existing: OnExisting,
    /// Overrides the store's default time to live.
    pub ttl: Option<Duration>,
    /// Display name and labels, checked by [`SessionMetadata::validate`].
    pub metadata: SessionMetadata,
}

impl CreateSession {
    /// A request for a session with a generated id, no state, the store's
    /// default time to live and no metadata; fails if the id is taken.
    pub fn new(app_name: AppName, user_id: UserId) -> Self {
        Self {
            app_name,
            user_id,
            session_id: None,
            state: State::new(),
            on_existing: OnExisting::Fail,
            ttl: None,
            metadata: SessionMetadata::default(),
        }
    }

    /// Asks for this session id instead of a generated one.
    pub fn with_id(mut self, id: impl Into<String>) -> Self {
        self.session_id = Some(id.into());
        self
    }

    /// Sets the initial state.
    pub fn with_state(mut self, state: State) -> Self {
        self.state = state;
        self
    }

    /// Returns the existing session instead of failing when the id is taken.
    pub fn return_existing(mut self) -> Self {
        self.on_existing = OnExisting::ReturnExisting;
        self
    }

    /// Sets this session's time to live.
    pub fn with_ttl(mut self, ttl: Duration) -> Self {
        self.ttl = Some(ttl);
        self
    }

    /// Sets the display name and labels.
    pub fn with_metadata(mut self, metadata: SessionMetadata) -> Self {
        self.metadata = metadata;
        self
    }
}

/// Which events a `get` returns. Both filters together return their
/// intersection: the most recent `num_recent_events` of those at or after
/// `after`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct GetOptions {
    /// Only the last N events; `Some(0)` returns none.
    pub num_recent_events: Option<usize>,
    /// Only events whose timestamp is at or after this instant (inclusive,
    /// compared to the nanosecond).
    pub after: Option<DateTime<Utc>>,
}

/// Conditions on an append.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct AppendOptions {
    /// The `version` the caller loaded; a different current version means
    /// someone appended in between, and the append fails with `StaleSession`.
    pub expected_version: Option<u64>,
    /// Take part in the session's invocation lease ([`crate::lease`]):
    /// refused while another invocation holds it. `None` ignores the lease.
    pub lease: Option<InvocationLease>,
}

/// What an append did.
#[derive(Debug, Clone, PartialEq)]
pub struct Appended {
    /// The event as stored (`temp:` keys removed), or as given when partial.
    pub event: Event,
    /// Its sequence number; `None` for a partial event, which is not stored.
    pub seq: Option<u64>,
    /// True when an identical event with this id was already stored: a retry.
    pub replayed: bool,
    /// The session's last update time after the append, when it was written.
    pub last_update_time: Option<DateTime<Utc>>,
    /// The lease this append holds (or released), when it asked for one and
    /// was stored; pass its generation back with the invocation's next append.
    pub lease: Option<LeaseGrant>,
}

/// Most sessions one list page returns.
pub const MAX_PAGE_SIZE: usize = 200;
/// Page size when the caller does not choose.
pub const DEFAULT_PAGE_SIZE: usize = 50;

/// A list request for one user of one app.
#[derive(Debug, Clone)]
pub struct ListSessions {
    /// The app to list.
    pub app_name: AppName,
    /// The user whose sessions to list.
    pub user_id: UserId,
    /// Clamped to 1..=200; default 50.
    pub page_size: Option<usize>,
    /// The previous page's `next_page_token`; `None` starts at the most
    /// recently updated session.
    pub page_token: Option<PageToken>,
    /// Only sessions carrying every one of these labels with these values.
    pub labels: BTreeMap<String, String>,
    /// Only sessions last updated at or after this instant.
    pub updated_after: Option<DateTime<Utc>>,
    /// Only sessions last updated before this instant (exclusive).
    pub updated_before: Option<DateTime<Utc>>,
}

impl ListSessions {
    /// A request for the first page of the user's sessions, with no filter.
    pub fn new(app_name: AppName, user_id: UserId) -> Self {
        Self {
            app_name,
            user_id,
            page_size: None,
            page_token: None,
            labels: BTreeMap::new(),
            updated_after: None,
            updated_before: None,
        }
    }

    /// Adds a label filter: only sessions whose label `key` is `value`.
    pub fn with_label(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.labels.insert(key.into(), value.into());
        self
    }

    /// Checks the filters: label bounds as for a session's labels, and a
    /// window that is not empty by construction.
    pub fn validate_filters(&self) -> Result<(), StoreError> {
        validate_listing_filters(&self.labels, self.updated_after, self.updated_before)
    }

    /// The page size the store uses: `page_size` clamped to 1..=200, else 50.
    pub fn effective_page_size(&self) -> usize {
        self.page_size.unwrap_or(DEFAULT_PAGE_SIZE).clamp(1, MAX_PAGE_SIZE)
    }
}

/// The filters a listing takes (a user's, or an app's): label bounds as for
/// a session's labels, and an update window not empty by construction.
pub(crate) fn validate_listing_filters(
    labels: &BTreeMap<String, String>,
    updated_after: Option<DateTime<Utc>>,
    updated_before: Option<DateTime<Utc>>,
) -> Result<(), StoreError> {
    validate_labels("labels", labels)?;
    if let (Some(after), Some(before)) = (updated_after, updated_before)
        && after >= before
    {
        return Err(StoreError::invalid("updated_before", "must be later than updated_after"));
    }
    Ok(())
}

/// One page of a listing, newest first.
#[derive(Debug, Clone, PartialEq)]
pub struct SessionPage {
    /// The sessions of this page, most recently updated first.
    pub sessions: Vec<SessionSummary>,
    /// Present when more sessions may follow.
    pub next_page_token: Option<PageToken>,
}

/// An opaque cursor: the position after the last session of a page, in the
/// listing's order (last update time descending, then id descending).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct PageToken(String);

impl PageToken {
    const VERSION: &'static str = "v1";

    /// The cursor after a session updated at `updated_micros` with `id`.
    pub fn after(updated_micros: i64, id: &SessionId) -> Self {
        let raw = format!("{}:{updated_micros}:{}", Self::VERSION, id.as_str());
        Self(URL_SAFE_NO_PAD.encode(raw))
    }

    /// Accepts a token string a client sent back; checks it decodes.
    pub fn parse(token: &str) -> Result<Self, StoreError> {
        let token = Self(token.to_owned());
        token.position()?;
        Ok(token)
    }

    /// The (microseconds since epoch, session id) this token points after.
    pub fn position(&self) -> Result<(i64, SessionId), StoreError> {
        let bad = || StoreError::invalid("page_token", "not a token this store issued");
        let raw = URL_SAFE_NO_PAD.decode(&self.0).map_err(|_| bad())?;
        let raw = String::from_utf8(raw).map_err(|_| bad())?;
        let mut parts = raw.splitn(3, ':');
        if parts.next() != Some(Self::VERSION) {
            return Err(bad());
        }
        let micros = parts.next().and_then(|m| m.parse::<i64>().ok()).ok_or_else(bad)?;
        // Only positions a listing can produce: a real instant in years 1 to 9999.
        let plausible = DateTime::<Utc>::from_timestamp_micros(micros).is_some_and(|t| (1..=9999).contains(&t.year()));
        if !plausible {
            return Err(bad());
        }
        let id = parts.next().ok_or_else(bad).and_then(|id| SessionId::new(id).map_err(|_| bad()))?;
        Ok((micros, id))
    }

    /// The token as sent to clients.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Display for PageToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// What erasing a user removed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Erasure {
    /// Sessions deleted, expired ones included.
    pub sessions: u64,
    /// Events deleted with them.
    pub events: u64,
    /// Whether the user had user-scoped state, now gone.
    pub user_state: bool,
}

/// Settings both stores share.
#[derive(Debug, Clone, Default)]
pub struct StoreConfig {
    /// Time to live given to new sessions; `None` keeps them until deleted.
    pub default_ttl: Option<Duration>,
    /// Sessions older than this refuse appends and must be rolled over;
    /// `None` allows any age.
    pub max_session_lifetime: Option<Duration>,
    /// Media (inline data) of this many bytes or more is stored once,
    /// outside the event ([`crate::blob`]); `None` is
    /// [`crate::blob::DEFAULT_MEDIA_OFFLOAD_BYTES`].
    pub media_offload_bytes: Option<usize>,
}

impl StoreConfig {
    /// The size from which media leaves an event.
    pub fn media_offload_bytes(&self) -> usize {
        self.media_offload_bytes.unwrap_or(crate::blob::DEFAULT_MEDIA_OFFLOAD_BYTES)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn page_tokens_round_trip_and_reject_garbage() {
        let id = SessionId::new("s:1").unwrap();
        let token = PageToken::after(-5, &id);
        assert_eq!(PageToken::parse(token.as_str()).unwrap().position().unwrap(), (-5, id));
        let out_of_range = PageToken::after(i64::MIN, &SessionId::new("s").unwrap());
        assert!(out_of_range.position().is_err());
        for garbage in ["", "!!", "djE6eDp5", "bm9wZQ"] {
            assert!(
                matches!(PageToken::parse(garbage), Err(StoreError::InvalidInput { field, .. }) if field == "page_token")
            );
        }
    }

    #[test]
    fn page_size_is_capped() {
        let mut req = ListSessions::new(AppName::new("a").unwrap(), UserId::new("u").unwrap());
        assert_eq!(req.effective_page_size(), DEFAULT_PAGE_SIZE);
        req.page_size = Some(10_000);
        assert_eq!(req.effective_page_size(), MAX_PAGE_SIZE);
        req.page_size = Some(0);
        assert_eq!(req.effective_page_size(), 1);
    }
}
