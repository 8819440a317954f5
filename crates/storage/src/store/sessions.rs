//! Sessions: create, get, list, delete, find by id, metadata and rollover.

use std::collections::BTreeMap;

use adk_postgres_domain::event::timestamp_to_nanos;
use adk_postgres_domain::state::{SharedScopes, merge_scopes};
use adk_postgres_domain::{
    AppName, CreateSession, Event, GetOptions, JsonSession, ListSessions, OnExisting, PageToken, ScopedState, Session,
    SessionId, SessionKey, SessionMetadata, SessionPage, SessionSummary, StoreError, UserId,
};
use chrono::{DateTime, Utc};
use serde_json::Value;

use super::media::MEDIA_MARKER;
use super::{PgSessionStore, TenantScope, interval, media, only_row, single, stored_state, to_json, version};
use crate::conn::Load as _;
use crate::error::from_diesel;
use crate::functions::{
    self as sql, BlobRow, CreatedRow, DeletedRow, FoundRow, MetadataOutcome, MetadataRow, ReadRow, RolloverOutcome,
    RolloverRow, SessionsRow,
};
use crate::pool::with_retries;

/// Labels as the jsonb object the store's functions take.
pub(super) fn labels_json(labels: &BTreeMap<String, String>) -> Value {
    Value::Object(labels.iter().map(|(k, v)| (k.clone(), Value::String(v.clone()))).collect())
}

/// An `updated_at` window bound as PostgreSQL compares it with stored update
/// times, which are whole microseconds: rounded up to the next microsecond,
/// which keeps both `t >= bound` and `t < bound` exact for every stored `t`
/// (binding it as is would truncate it, and a bound a few nanoseconds after
/// a session's update time would still include it), and never before
/// PostgreSQL's first instant, 4714 BC, before which nothing is stored.
pub(super) fn window_bound(bound: DateTime<Utc>) -> DateTime<Utc> {
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
    pub(super) async fn set_session_metadata(
        &self,
        key: &SessionKey,
        metadata: SessionMetadata,
    ) -> Result<(), StoreError> {
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

    pub(super) async fn create_session(&self, request: CreateSession) -> Result<Session, StoreError> {
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

    /// The session, with the media its events name put back in place.
    pub(crate) async fn load_session(&self, key: &SessionKey, options: GetOptions) -> Result<Session, StoreError> {
        self.load_json_session(key, options).await?.into_session()
    }

    /// The session with its events as JSON, media put back in place. The
    /// media is read by a second call, made only when an event names any;
    /// when a blob is gone by then, the session changed between the two
    /// reads, and the whole read runs again.
    pub(crate) async fn load_json_session(
        &self,
        key: &SessionKey,
        options: GetOptions,
    ) -> Result<JsonSession, StoreError> {
        const READS: usize = 3;
        for _ in 0..READS {
            let mut session = self.load_json_session_once(key, &options).await?;
            // Only events that may hold a reference are parsed here; the
            // marker is a key, so an event without it names no media.
            let marker = memchr::memmem::Finder::new(MEDIA_MARKER);
            let mut with_media: Vec<(usize, Event)> = Vec::new();
            for (index, json) in session.events.iter().enumerate() {
                if marker.find(json).is_some() {
                    let event = serde_json::from_slice(json).map_err(|e| StoreError::Database {
                        message: format!("stored event {index} of the session is corrupt: {e}"),
                    })?;
                    with_media.push((index, event));
                }
            }
            let mut events: Vec<Event> = with_media.iter().map(|(_, event)| event.clone()).collect();
            let wanted = media::references(&events);
            if wanted.is_empty() {
                return Ok(session);
            }
            let rows = with_retries!(self, |conn| sql::GetBlobs { key: self.key_args(key), sha256: &wanted }
                .load::<BlobRow>(&mut conn)
                .await
                .map_err(|e| from_diesel(e, "state")))?;
            if media::put_back(&mut events, rows).is_ok() {
                for ((index, _), event) in with_media.iter().zip(&events) {
                    let json = serde_json::to_vec(event).map_err(|e| StoreError::Database {
                        message: format!("stored event {index} does not serialize with its media: {e}"),
                    })?;
                    session.events.replace(*index, &json);
                }
                return Ok(session);
            }
        }
        Err(StoreError::Conflict {
            message: format!("the session's media changed under {READS} reads in a row; try again"),
        })
    }

    async fn load_json_session_once(&self, key: &SessionKey, options: &GetOptions) -> Result<JsonSession, StoreError> {
        let after = options
            .after
            .map(|after| timestamp_to_nanos(after).unwrap_or(if after.timestamp() < 0 { i64::MIN } else { i64::MAX }));
        let limit = options.num_recent_events.map(|n| i64::try_from(n).unwrap_or(i64::MAX));
        let rows = with_retries!(self, |conn| sql::ReadSession { key: self.key_args(key), after_ts: after, limit }
            .load::<ReadRow>(&mut conn)
            .await
            .map_err(|e| from_diesel(e, "state")))?;
        let session = rows.into_iter().next().ok_or_else(|| StoreError::NotFound(key.clone()))?;
        let events = session.events.0;
        let last_seq = session.last_seq;
        let session_state = stored_state("session state", Some(session.state))?;
        let user = stored_state("user state", session.user_state)?;
        let app = stored_state("app state", session.app_state)?;
        let session = Session {
            key: key.clone(),
            state: SharedScopes::new(&user, &app).merge_into(session_state),
            events: Vec::new(),
            version: version(last_seq),
            last_update_time: session.updated_at,
            created_at: session.created_at,
            expires_at: session.expires_at,
            closed_at: session.closed_at,
            successor: session
                .successor_id
                .map(SessionId::new)
                .transpose()
                .map_err(|e| StoreError::Database { message: format!("stored successor id is corrupt: {e}") })?,
            metadata: SessionMetadata { display_name: session.display_name, labels: session.labels.0 },
        };
        Ok(JsonSession { session, events })
    }

    pub(super) async fn list_sessions(&self, request: &ListSessions) -> Result<SessionPage, StoreError> {
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
        let page = with_retries!(self, |conn| sql::ReadSessions {
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
        .load::<SessionsRow>(&mut conn)
        .await
        .map_err(|e| from_diesel(e, "state")))?;
        // No row: the app is not the tenant's, which lists as nothing.
        let Some(page) = single(page) else {
            return Ok(SessionPage { sessions: Vec::new(), next_page_token: None });
        };
        let SessionsRow {
            session_ids,
            states,
            last_seqs,
            created_ats,
            updated_ats,
            expires_ats,
            display_names,
            label_sets,
            user_state,
            app_state,
        } = page;
        let listed = session_ids.len();
        if [states.len(), last_seqs.len(), created_ats.len(), updated_ats.len()]
            .into_iter()
            .chain([expires_ats.len(), display_names.len(), label_sets.len()])
            .any(|len| len != listed)
        {
            return Err(StoreError::Database {
                message: "adk_read_sessions returned arrays of different lengths".to_owned(),
            });
        }
        let more = listed > page_size;
        let mut sessions = Vec::with_capacity(listed.min(page_size));
        if listed > 0 {
            // The page's user and app state: the same for every session of
            // one app and user, merged into each.
            let shared =
                SharedScopes::new(&stored_state("user state", user_state)?, &stored_state("app state", app_state)?);
            let columns = session_ids.into_iter().zip(states).zip(last_seqs).zip(created_ats).zip(updated_ats);
            let columns = columns.zip(expires_ats).zip(display_names).zip(label_sets);
            for (((((((session_id, state), last_seq), created_at), updated_at), expires_at), display_name), labels) in
                columns.take(page_size)
            {
                let session_id = SessionId::new(session_id)
                    .map_err(|e| StoreError::Database { message: format!("stored session id is corrupt: {e}") })?;
                let session_state = stored_state("session state", Some(state))?;
                sessions.push(SessionSummary {
                    key: SessionKey::new(request.app_name.clone(), request.user_id.clone(), session_id),
                    state: shared.merge_into(session_state),
                    version: version(last_seq),
                    last_update_time: updated_at,
                    created_at,
                    expires_at,
                    metadata: SessionMetadata { display_name, labels: labels.0 },
                });
            }
        }
        let next_page_token = if more {
            sessions.last().map(|s| PageToken::after(s.last_update_time.timestamp_micros(), &s.key.session_id))
        } else {
            None
        };
        Ok(SessionPage { sessions, next_page_token })
    }

    pub(super) async fn delete_session(&self, key: &SessionKey) -> Result<(), StoreError> {
        with_retries!(self, |conn| sql::DeleteSession { key: self.key_args(key) }
            .load::<DeletedRow>(&mut conn)
            .await
            .map_err(|e| from_diesel(e, "state")))?;
        Ok(())
    }
    pub(super) async fn rollover_session(
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

    pub(super) async fn find_sessions(
        &self,
        session_id: &SessionId,
        limit: usize,
    ) -> Result<Vec<SessionKey>, StoreError> {
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
}
