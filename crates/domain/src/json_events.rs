//! A session's events as the JSON they are stored as, for a caller that
//! decodes them into types of its own (the adk adapter reads them straight
//! into adk's `Event`): decoding into [`Event`] first and converting after
//! would parse and allocate every event twice.
//!
//! The JSON is [`Event`]'s serde form, media put back in place, so any
//! reader of it sees what [`SessionStore::get`](crate::SessionStore::get)
//! would have returned.

use std::ops::Range;

use crate::error::StoreError;
use crate::event::Event;
use crate::session::Session;

/// Events as JSON documents, in append order, in one buffer: a get of a
/// thousand events makes two allocations for them, not a thousand.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct JsonEvents {
    bytes: Vec<u8>,
    spans: Vec<Range<usize>>,
}

impl JsonEvents {
    /// Room for `events` documents of `bytes` in total.
    pub fn with_capacity(events: usize, bytes: usize) -> Self {
        Self { bytes: Vec::with_capacity(bytes), spans: Vec::with_capacity(events) }
    }

    /// Each event's serde form.
    pub fn from_events(events: &[Event]) -> Result<Self, StoreError> {
        let mut json = Self::default();
        for event in events {
            let start = json.bytes.len();
            serde_json::to_writer(&mut json.bytes, event)
                .map_err(|e| StoreError::invalid("event", format!("{:?} does not serialize: {e}", event.id)))?;
            json.spans.push(start..json.bytes.len());
        }
        Ok(json)
    }

    /// Adds one event's JSON at the end. The caller vouches that it is an
    /// [`Event`]'s serde form; readers report anything else as corrupt.
    pub fn push(&mut self, json: &[u8]) {
        let start = self.bytes.len();
        self.bytes.extend_from_slice(json);
        self.spans.push(start..self.bytes.len());
    }

    /// Puts `json` in place of the `index`-th event (media put back); the
    /// old bytes stay in the buffer unused. `false` if there is no such
    /// event.
    pub fn replace(&mut self, index: usize, json: &[u8]) -> bool {
        let start = self.bytes.len();
        let Some(span) = self.spans.get_mut(index) else { return false };
        self.bytes.extend_from_slice(json);
        *span = start..self.bytes.len();
        true
    }

    /// How many events there are.
    pub fn len(&self) -> usize {
        self.spans.len()
    }

    /// Whether there are no events.
    pub fn is_empty(&self) -> bool {
        self.spans.is_empty()
    }

    /// The `index`-th event's JSON.
    pub fn get(&self, index: usize) -> Option<&[u8]> {
        self.spans.get(index).and_then(|span| self.bytes.get(span.clone()))
    }

    /// Each event's JSON, in append order.
    pub fn iter(&self) -> impl ExactSizeIterator<Item = &[u8]> + '_ {
        self.spans.iter().map(|span| &self.bytes[span.clone()])
    }

    /// The events as [`Event`]s; a document that is not one is
    /// `StoreError::Database`, naming its position.
    pub fn decode(&self) -> Result<Vec<Event>, StoreError> {
        self.iter()
            .enumerate()
            .map(|(index, json)| {
                serde_json::from_slice(json).map_err(|e| StoreError::Database {
                    message: format!("stored event {index} of the session is corrupt: {e}"),
                })
            })
            .collect()
    }
}

/// A session as [`SessionStore::get_json`](crate::SessionStore::get_json)
/// returns it: everything `get` returns, with the events as JSON
/// (`session.events` is empty).
#[derive(Debug, Clone, PartialEq)]
pub struct JsonSession {
    /// The session with an empty `events`; the events are in `events`.
    pub session: Session,
    /// The session's events as JSON, in order.
    pub events: JsonEvents,
}

impl JsonSession {
    /// The session as `get` returns it, events decoded.
    pub fn into_session(self) -> Result<Session, StoreError> {
        let Self { mut session, events } = self;
        session.events = events.decode()?;
        Ok(session)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_keep_their_order_and_a_replaced_one_reads_anew() {
        let events: Vec<Event> = (0..3).map(|n| Event::new(format!("agent-{n}"))).collect();
        let mut json = JsonEvents::from_events(&events).unwrap();
        assert_eq!(json.len(), 3);
        assert_eq!(json.decode().unwrap(), events);

        let mut other = events[1].clone();
        other.author = "someone else".into();
        assert!(json.replace(1, &serde_json::to_vec(&other).unwrap()));
        assert!(!json.replace(3, b"{}"));
        assert_eq!(json.decode().unwrap(), vec![events[0].clone(), other, events[2].clone()]);
    }

    #[test]
    fn a_document_that_is_no_event_is_corrupt_and_named() {
        let mut json = JsonEvents::default();
        json.push(br#"{"id": "x"}"#);
        assert!(matches!(json.decode(), Err(StoreError::Database { message }) if message.contains("event 0")));
    }
}
