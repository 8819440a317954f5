//! Listing an app's sessions across its users (`SessionStore::list_app_sessions`),
//! for support and admin tools: the user listing's filters, newest created
//! first, in keyset pages.
//!
//! Ordered by creation, not by last update as a user's listing is: an
//! append moves `updated_at` on every call and must stay a HOT update, so no
//! index may hold it, and an app-wide listing ordered by it would sort every
//! session of the app on every page.

use std::collections::BTreeMap;

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use chrono::{DateTime, Datelike, Utc};

use crate::error::StoreError;
use crate::ids::{AppName, SessionId, UserId};
use crate::session::{DEFAULT_PAGE_SIZE, MAX_PAGE_SIZE, SessionSummary};

/// A list request for every user of one app.
#[derive(Debug, Clone)]
pub struct ListAppSessions {
    /// The app whose sessions to list, across all its users.
    pub app_name: AppName,
    /// Clamped to 1..=200; default 50.
    pub page_size: Option<usize>,
    /// The previous page's `next_page_token`; `None` starts at the newest session.
    pub page_token: Option<AppPageToken>,
    /// Only sessions carrying every one of these labels with these values.
    pub labels: BTreeMap<String, String>,
    /// Only sessions last updated at or after this instant.
    pub updated_after: Option<DateTime<Utc>>,
    /// Only sessions last updated before this instant (exclusive).
    pub updated_before: Option<DateTime<Utc>>,
}

impl ListAppSessions {
    /// A request for the first page of `app_name`'s sessions, with no filter.
    pub fn new(app_name: AppName) -> Self {
        Self {
            app_name,
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

    /// The same checks as a user's listing: label bounds, and a window that
    /// is not empty by construction.
    pub fn validate_filters(&self) -> Result<(), StoreError> {
        crate::session::validate_listing_filters(&self.labels, self.updated_after, self.updated_before)
    }

    /// The page size the store uses: `page_size` clamped to 1..=200, else 50.
    pub fn effective_page_size(&self) -> usize {
        self.page_size.unwrap_or(DEFAULT_PAGE_SIZE).clamp(1, MAX_PAGE_SIZE)
    }
}

/// One page of an app's sessions, newest created first. Each summary's key
/// names its user.
#[derive(Debug, Clone, PartialEq)]
pub struct AppSessionPage {
    /// The sessions of this page, newest created first.
    pub sessions: Vec<SessionSummary>,
    /// Present when more sessions may follow.
    pub next_page_token: Option<AppPageToken>,
}

/// An opaque cursor of the app-wide listing: the position after the last
/// session of a page, in its order (created_at descending, then user id,
/// then session id, descending). Not interchangeable with a user listing's
/// [`crate::PageToken`]: each refuses the other's.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct AppPageToken(String);

/// Where an [`AppPageToken`] points after.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AppPosition {
    /// The session's creation time, microseconds since the epoch.
    pub created_micros: i64,
    /// The session's user.
    pub user_id: UserId,
    /// The session's id.
    pub session_id: SessionId,
}

impl AppPageToken {
    const VERSION: &'static str = "a1";

    /// The cursor after a session created at `created_micros`.
    pub fn after(created_micros: i64, user_id: &UserId, session_id: &SessionId) -> Self {
        // The user id's length comes first: ids may hold any separator.
        let user = user_id.as_str();
        let raw = format!("{}:{created_micros}:{}:{user}:{}", Self::VERSION, user.len(), session_id.as_str());
        Self(URL_SAFE_NO_PAD.encode(raw))
    }

    /// Accepts a token string a client sent back; checks it decodes.
    pub fn parse(token: &str) -> Result<Self, StoreError> {
        let token = Self(token.to_owned());
        token.position()?;
        Ok(token)
    }

    /// The position this token points after.
    pub fn position(&self) -> Result<AppPosition, StoreError> {
        let bad = || StoreError::invalid("page_token", "not an app listing token this store issued");
        let raw = URL_SAFE_NO_PAD.decode(&self.0).map_err(|_| bad())?;
        let raw = String::from_utf8(raw).map_err(|_| bad())?;
        let mut parts = raw.splitn(4, ':');
        if parts.next() != Some(Self::VERSION) {
            return Err(bad());
        }
        let micros = parts.next().and_then(|m| m.parse::<i64>().ok()).ok_or_else(bad)?;
        // Only positions a listing can produce: a real instant in years 1 to 9999.
        let plausible = DateTime::<Utc>::from_timestamp_micros(micros).is_some_and(|t| (1..=9999).contains(&t.year()));
        if !plausible {
            return Err(bad());
        }
        let user_len = parts.next().and_then(|n| n.parse::<usize>().ok()).ok_or_else(bad)?;
        let rest = parts.next().ok_or_else(bad)?;
        let user = rest.get(..user_len).ok_or_else(bad)?;
        let session = rest.get(user_len..).and_then(|s| s.strip_prefix(':')).ok_or_else(bad)?;
        Ok(AppPosition {
            created_micros: micros,
            user_id: UserId::new(user).map_err(|_| bad())?,
            session_id: SessionId::new(session).map_err(|_| bad())?,
        })
    }

    /// The token as sent to clients.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Display for AppPageToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::PageToken;

    #[test]
    fn app_tokens_round_trip_and_refuse_garbage_and_user_listing_tokens() {
        let user = UserId::new("u:1:x").unwrap();
        let session = SessionId::new("s:2").unwrap();
        let token = AppPageToken::after(-5, &user, &session);
        let position = AppPageToken::parse(token.as_str()).unwrap().position().unwrap();
        assert_eq!(position, AppPosition { created_micros: -5, user_id: user.clone(), session_id: session.clone() });

        let user_listing = PageToken::after(5, &session);
        assert!(AppPageToken::parse(user_listing.as_str()).is_err(), "a user listing's token is refused");
        assert!(PageToken::parse(token.as_str()).is_err(), "and the other way round");
        let out_of_range = AppPageToken::after(i64::MIN, &user, &session);
        assert!(out_of_range.position().is_err());
        for garbage in ["", "!!", "YTE6MTo5OTp1OnM", "YTE6MTox", "bm9wZQ"] {
            assert!(
                matches!(AppPageToken::parse(garbage), Err(StoreError::InvalidInput { field, .. }) if field == "page_token"),
                "{garbage}"
            );
        }
    }

    #[test]
    fn filters_are_checked_like_the_user_listing() {
        let mut request = ListAppSessions::new(AppName::new("a").unwrap());
        assert!(request.validate_filters().is_ok());
        let now = Utc::now();
        request.updated_after = Some(now);
        request.updated_before = Some(now);
        assert!(
            matches!(request.validate_filters(), Err(StoreError::InvalidInput { field, .. }) if field == "updated_before")
        );
        request.page_size = Some(0);
        assert_eq!(request.effective_page_size(), 1);
    }
}
