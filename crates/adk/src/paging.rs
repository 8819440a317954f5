//! Paging through a session's events, which adk's `SessionService` has no
//! slot for: exposed on [`PgSessionService`] as the store offers it
//! (`SessionStore::list_events`), with adk events.

use adk_core::Result;
use adk_postgres_domain::{EventPage, SessionKey};

use crate::error::to_adk_error;
use crate::event::into_adk_event;
use crate::service::PgSessionService;

/// One page of a session's adk events, as [`PgSessionService::list_events`]
/// returns it.
#[derive(Debug, Clone)]
pub struct AdkEventsPage {
    /// `(seq, event)` in ascending `seq` order, whichever way the page went.
    pub events: Vec<(u64, adk_core::Event)>,
    /// Whether more events lie beyond this page in its direction.
    pub more: bool,
    /// The session's version in the snapshot the page was read in.
    pub version: u64,
}

impl AdkEventsPage {
    /// The request for the page after this one in `page`'s direction, when
    /// there is one.
    pub fn next(&self, page: EventPage) -> Option<EventPage> {
        use adk_postgres_domain::EventCursor;
        if !self.more {
            return None;
        }
        let cursor = if page.cursor.is_forward() {
            EventCursor::After(self.events.last()?.0)
        } else {
            EventCursor::Before(self.events.first()?.0)
        };
        Some(EventPage { cursor, limit: page.limit })
    }
}

impl PgSessionService {
    /// One page of the session's events without loading the session
    /// (`EventPage::first(100)`, `EventPage::before(seq, 50)`, …): at most
    /// 1,000, in one snapshot. A bad limit is an invalid-argument error
    /// naming `limit`; a missing session is not-found.
    pub async fn list_events(&self, identity: &adk_core::AdkIdentity, page: EventPage) -> Result<AdkEventsPage> {
        let key =
            SessionKey::parse(identity.app_name.as_ref(), identity.user_id.as_ref(), identity.session_id.as_ref())
                .map_err(to_adk_error)?;
        let read = self.store().list_events(&key, page).await.map_err(to_adk_error)?;
        let events = read
            .events
            .into_iter()
            .map(|e| into_adk_event(e.event).map(|event| (e.seq, event)))
            .collect::<Result<Vec<_>>>()?;
        Ok(AdkEventsPage { events, more: read.more, version: read.version })
    }
}
