//! The `adk_session::Session` the service hands out: a snapshot of one
//! session as the store returned it, with events already in adk form (the
//! `Events` trait lends `&Event`, so they are converted once, up front).

use std::collections::HashMap;

use adk_core::AdkError;
use adk_postgres_domain::{JsonSession, Session as StoreSession, SessionKey, SessionSummary, State as StoreState};
use adk_session::{Event, Events, Session, State};
use chrono::{DateTime, Utc};
use serde_json::Value;

use crate::event::into_adk_event;
use crate::event_json::adk_event_from_json;

#[derive(Debug, Clone)]
pub(crate) struct LoadedSession {
    app_name: String,
    user_id: String,
    id: String,
    /// The store's map as it came: adk asks for single keys (`get`) far
    /// more often than for a copy of all of them, so converting every
    /// session's state to a `HashMap` up front would be wasted on a list.
    state: StoreState,
    events: Vec<Event>,
    last_update_time: DateTime<Utc>,
}

impl LoadedSession {
    /// Takes the store's session apart: its events and state move into the
    /// snapshot instead of being copied.
    pub(crate) fn from_store(session: StoreSession) -> Result<Self, AdkError> {
        let events = session.events.into_iter().map(into_adk_event).collect::<Result<Vec<_>, _>>()?;
        Ok(Self::new(session.key, session.state, events, session.last_update_time))
    }

    /// A got session: its events read from their stored JSON straight into
    /// adk events.
    pub(crate) fn from_json(stored: JsonSession) -> Result<Self, AdkError> {
        let JsonSession { session, events } = stored;
        // Sized up front: an adk event is a large struct, and growing the
        // vector would copy every event read so far each time.
        let mut read = Vec::with_capacity(events.len());
        for json in events.iter() {
            read.push(adk_event_from_json(json)?);
        }
        let events = read;
        Ok(Self::new(session.key, session.state, events, session.last_update_time))
    }

    /// A listed session: metadata and live state, never events.
    pub(crate) fn from_summary(summary: SessionSummary) -> Self {
        Self::new(summary.key, summary.state, Vec::new(), summary.last_update_time)
    }

    fn new(key: SessionKey, state: StoreState, events: Vec<Event>, at: DateTime<Utc>) -> Self {
        Self {
            app_name: key.app_name.into(),
            user_id: key.user_id.into(),
            id: key.session_id.into(),
            state,
            events,
            last_update_time: at,
        }
    }
}

impl Session for LoadedSession {
    fn id(&self) -> &str {
        &self.id
    }

    fn app_name(&self) -> &str {
        &self.app_name
    }

    fn user_id(&self) -> &str {
        &self.user_id
    }

    fn state(&self) -> &dyn State {
        self
    }

    fn events(&self) -> &dyn Events {
        self
    }

    fn last_update_time(&self) -> DateTime<Utc> {
        self.last_update_time
    }
}

impl State for LoadedSession {
    fn get(&self, key: &str) -> Option<Value> {
        self.state.get(key).cloned()
    }

    /// Changes this snapshot only; state is persisted through an event's
    /// state delta. A key adk-core refuses is ignored with a warning, as
    /// adk-session's own sessions do (the trait cannot return an error).
    fn set(&mut self, key: String, value: Value) {
        if let Err(reason) = adk_core::validate_state_key(&key) {
            tracing::warn!(key = %key, "ignoring invalid state key: {reason}");
            return;
        }
        self.state.insert(key, value);
    }

    fn all(&self) -> HashMap<String, Value> {
        self.state.iter().map(|(key, value)| (key.clone(), value.clone())).collect()
    }
}

impl Events for LoadedSession {
    fn all(&self) -> Vec<Event> {
        self.events.clone()
    }

    fn len(&self) -> usize {
        self.events.len()
    }

    fn at(&self, index: usize) -> Option<&Event> {
        self.events.get(index)
    }
}
