//! Reads without loading a session: a page of one session's events
//! (`list_events`, `adk_list_events`) and a page of an app's sessions across
//! its users (`list_app_sessions`, `adk_list_app_sessions`). One call each,
//! and a second only for the media a page of events names, as for a get.

use adk_postgres_domain::state::SharedScopes;
use adk_postgres_domain::{
    AppPageToken, AppSessionPage, Event, EventCursor, EventPage, EventsPage, ListAppSessions, SequencedEvent,
    SessionId, SessionKey, SessionMetadata, SessionSummary, StoreError, UserId,
};
use chrono::{DateTime, Utc};

use super::sessions::{labels_json, window_bound};
use super::{PgSessionStore, media, stored_state, version};
use crate::conn::Load as _;
use crate::error::from_diesel;
use crate::functions::{self as sql, AppSummaryRow, BlobRow, EventPageRow};
use crate::pool::with_retries;

fn corrupt(what: &str) -> StoreError {
    StoreError::Database { message: format!("{what} is corrupt") }
}

impl PgSessionStore {
    /// The page, with the media its events name put back in place; when a
    /// blob is gone by the second read, the session changed in between, and
    /// the page is read again.
    pub(super) async fn list_events_page(&self, key: &SessionKey, page: EventPage) -> Result<EventsPage, StoreError> {
        page.validate()?;
        const READS: usize = 3;
        for _ in 0..READS {
            let mut read = self.list_events_once(key, page).await?;
            let (seqs, mut events): (Vec<u64>, Vec<Event>) = read.events.drain(..).map(|e| (e.seq, e.event)).unzip();
            let wanted = media::references(&events);
            if !wanted.is_empty() {
                let rows = with_retries!(self, |conn| sql::GetBlobs { key: self.key_args(key), sha256: &wanted }
                    .load::<BlobRow>(&mut conn)
                    .await
                    .map_err(|e| from_diesel(e, "state")))?;
                if media::put_back(&mut events, rows).is_err() {
                    continue;
                }
            }
            read.events = seqs.into_iter().zip(events).map(|(seq, event)| SequencedEvent { seq, event }).collect();
            return Ok(read);
        }
        Err(StoreError::Conflict {
            message: format!("the session's media changed under {READS} reads in a row; try again"),
        })
    }

    async fn list_events_once(&self, key: &SessionKey, page: EventPage) -> Result<EventsPage, StoreError> {
        // validate() held both seqs to i64.
        let seq = |s: u64| i64::try_from(s).map_err(|_| StoreError::invalid("cursor", "seq out of range"));
        let (after, before) = match page.cursor {
            EventCursor::Start => (Some(0), None),
            EventCursor::After(s) => (Some(seq(s)?), None),
            EventCursor::End => (None, Some(i64::MAX)),
            EventCursor::Before(s) => (None, Some(seq(s)?)),
        };
        let limit = i64::try_from(page.limit).map_err(|_| StoreError::invalid("limit", "out of range"))?;
        let rows = with_retries!(self, |conn| sql::ListEvents { key: self.key_args(key), after, before, limit }
            .load::<EventPageRow>(&mut conn)
            .await
            .map_err(|e| from_diesel(e, "state")))?;
        let mut rows = rows.into_iter();
        let header = rows.next().ok_or_else(|| StoreError::NotFound(key.clone()))?;
        let last_seq = header.last_seq.ok_or_else(|| corrupt("adk_list_events' header"))?;
        let mut events = Vec::with_capacity(page.limit.min(rows.len()));
        for row in rows {
            let (Some(seq), Some(payload)) = (row.seq, row.payload) else {
                return Err(corrupt("an event row of adk_list_events"));
            };
            events.push(SequencedEvent { seq: version(seq), event: payload.0 });
        }
        // One more than the page was read to tell whether more follow.
        let more = events.len() > page.limit;
        events.truncate(page.limit);
        if !page.cursor.is_forward() {
            events.reverse();
        }
        Ok(EventsPage { events, more, version: version(last_seq) })
    }

    pub(super) async fn list_app_sessions_page(&self, request: &ListAppSessions) -> Result<AppSessionPage, StoreError> {
        request.validate_filters()?;
        let position = request.page_token.as_ref().map(AppPageToken::position).transpose()?;
        let after_created = position
            .as_ref()
            .map(|p| {
                DateTime::<Utc>::from_timestamp_micros(p.created_micros)
                    .ok_or_else(|| StoreError::invalid("page_token", "time out of range"))
            })
            .transpose()?;
        let page_size = request.effective_page_size();
        let labels = labels_json(&request.labels);
        let rows = with_retries!(self, |conn| sql::ListAppSessions {
            tenant: self.tenant_for(&request.app_name),
            app_name: request.app_name.as_str(),
            after_created,
            after_user: position.as_ref().map(|p| p.user_id.as_str()),
            after_session: position.as_ref().map(|p| p.session_id.as_str()),
            // One more than a page tells whether another page follows.
            limit: page_size as i64 + 1,
            labels: &labels,
            updated_after: request.updated_after.map(window_bound),
            updated_before: request.updated_before.map(window_bound),
        }
        .load::<AppSummaryRow>(&mut conn)
        .await
        .map_err(|e| from_diesel(e, "state")))?;
        let mut rows = rows.into_iter();
        let header = rows.next().ok_or_else(|| corrupt("adk_list_app_sessions' header"))?;
        let app = stored_state("app state", header.app_state)?;
        let rows: Vec<AppSummaryRow> = rows.collect();
        let more = rows.len() > page_size;
        let mut sessions = Vec::with_capacity(rows.len().min(page_size));
        for row in rows.into_iter().take(page_size) {
            sessions.push(summary(request, row, &app)?);
        }
        let next_page_token = if more {
            sessions
                .last()
                .map(|s| AppPageToken::after(s.created_at.timestamp_micros(), &s.key.user_id, &s.key.session_id))
        } else {
            None
        };
        Ok(AppSessionPage { sessions, next_page_token })
    }
}

fn summary(
    request: &ListAppSessions,
    row: AppSummaryRow,
    app: &adk_postgres_domain::State,
) -> Result<SessionSummary, StoreError> {
    let user_id = row.user_id.ok_or_else(|| corrupt("a listed session's user id")).and_then(|u| {
        UserId::new(u).map_err(|e| StoreError::Database { message: format!("stored user id is corrupt: {e}") })
    })?;
    let session_id = row.session_id.ok_or_else(|| corrupt("a listed session's id")).and_then(|s| {
        SessionId::new(s).map_err(|e| StoreError::Database { message: format!("stored session id is corrupt: {e}") })
    })?;
    let user = stored_state("user state", row.user_state)?;
    let session_state = stored_state("session state", row.state)?;
    Ok(SessionSummary {
        key: SessionKey::new(request.app_name.clone(), user_id, session_id),
        state: SharedScopes::new(&user, app).merge_into(session_state),
        version: version(row.last_seq.ok_or_else(|| corrupt("a listed session's last_seq"))?),
        last_update_time: row.updated_at.ok_or_else(|| corrupt("a listed session's updated_at"))?,
        created_at: row.created_at.ok_or_else(|| corrupt("a listed session's created_at"))?,
        expires_at: row.expires_at,
        metadata: SessionMetadata {
            display_name: row.display_name,
            labels: row.labels.ok_or_else(|| corrupt("a listed session's labels"))?.0,
        },
    })
}
