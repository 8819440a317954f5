//! The ADK event, as stored in the log. Fields the store reads are typed;
//! everything else an ADK runtime puts on an event (usage metadata, grounding,
//! long-running tool ids, future fields) rides along in `extra` untouched, so
//! a stored event reads back exactly as it was appended.

use chrono::{DateTime, TimeZone, Utc};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::blob::{Blob, DEFAULT_MEDIA_OFFLOAD_BYTES, offload};
use crate::error::StoreError;
use crate::ids::MAX_ID_CHARS;
use crate::redaction::Redaction;
use crate::state::{MAX_STATE_BYTES, ScopedState, State, TEMP_PREFIX, contains_nul};

/// Largest event accepted, as compact JSON, after its media left it
/// ([`crate::blob`]). Bigger documents belong in artifacts, with a reference
/// in the event.
pub const MAX_EVENT_BYTES: usize = 1 << 20;

/// Longest author or invocation id, in characters.
pub const MAX_LABEL_CHARS: usize = 256;

/// What an event asks of the session besides being recorded.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct EventActions {
    /// Keys to merge into state; routed by prefix, `temp:` never stored.
    #[serde(default)]
    pub state_delta: State,
    /// Artifact versions this event wrote.
    #[serde(default, skip_serializing_if = "Map::is_empty")]
    pub artifact_delta: Map<String, Value>,
    /// The agent to hand the conversation to next.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub transfer_to_agent: Option<String>,
    /// Hands control up to the parent agent (ends a loop agent's iterations).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub escalate: Option<bool>,
    /// The tool's response goes back without a model summary.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub skip_summarization: Option<bool>,
    /// Every other action field, stored and returned untouched.
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

/// One event of a conversation.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Event {
    /// Unique within its session; a retried append reuses it.
    pub id: String,
    /// The invocation (one turn through the runner) that produced the event;
    /// empty when none.
    #[serde(default)]
    pub invocation_id: String,
    /// `user` or the name of the agent that produced the event.
    pub author: String,
    /// When the event happened, to the nanosecond; `after` filters compare
    /// it exactly.
    #[serde(with = "nanos_rfc3339")]
    pub timestamp: DateTime<Utc>,
    /// Which agent in the hierarchy the event belongs to (`root.child`), so
    /// sub-agents can be given only their own branch's history.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub branch: Option<String>,
    /// The model content (role and parts), kept as JSON.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub content: Option<Value>,
    /// State changes and control flow the event asks for.
    #[serde(default)]
    pub actions: EventActions,
    /// A streaming chunk; partial events are never stored.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub partial: Option<bool>,
    /// The model finished its turn.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub turn_complete: Option<bool>,
    /// Set by `SessionStore::redact_event` only: the event is a tombstone
    /// (see [`crate::redaction`]); an append carrying it is refused.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub redaction: Option<Redaction>,
    /// Every other field of the runtime's event, stored and returned untouched.
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

impl Event {
    /// A minimal event with a fresh id and the current time.
    pub fn new(author: impl Into<String>) -> Self {
        Self {
            id: uuid::Uuid::new_v4().to_string(),
            invocation_id: String::new(),
            author: author.into(),
            timestamp: Utc::now(),
            branch: None,
            content: None,
            actions: EventActions::default(),
            partial: None,
            turn_complete: None,
            redaction: None,
            extra: Map::new(),
        }
    }

    /// Parses an event from JSON text; malformed input is an `InvalidInput`
    /// naming `event`.
    pub fn from_json(text: &str) -> Result<Self, StoreError> {
        serde_json::from_str(text).map_err(|e| StoreError::invalid("event", e.to_string()))
    }

    /// Parses an event from a JSON value.
    pub fn from_value(value: Value) -> Result<Self, StoreError> {
        serde_json::from_value(value).map_err(|e| StoreError::invalid("event", e.to_string()))
    }

    /// Whether this is a streaming chunk: an append returns it unstored.
    pub fn is_partial(&self) -> bool {
        self.partial == Some(true)
    }

    /// Nanoseconds since the Unix epoch, the stored `event_ts`.
    pub fn timestamp_nanos(&self) -> Result<i64, StoreError> {
        timestamp_to_nanos(self.timestamp)
            .ok_or_else(|| StoreError::invalid("event.timestamp", "outside the years 1677 to 2262"))
    }

    /// The event as it is stored: `temp:` keys removed from its state delta.
    pub fn without_temp_state(mut self) -> Self {
        self.actions.state_delta.retain(|key, _| !key.starts_with(TEMP_PREFIX));
        self
    }

    /// Checks the event and returns it as stored (`temp:` keys removed)
    /// together with its split delta and payload. Keys are validated before
    /// `temp:` keys are dropped, so a malformed key is refused, not ignored.
    /// Media of [`DEFAULT_MEDIA_OFFLOAD_BYTES`] or more leaves the payload.
    pub fn prepare_for_store(self) -> Result<(Self, PreparedEvent), StoreError> {
        self.prepare_for_store_with(DEFAULT_MEDIA_OFFLOAD_BYTES)
    }

    /// [`Event::prepare_for_store`], moving media of `offload_bytes` or more
    /// out of the payload into [`PreparedEvent::blobs`].
    pub fn prepare_for_store_with(self, offload_bytes: usize) -> Result<(Self, PreparedEvent), StoreError> {
        // The split validates every key, `temp:` ones included, and leaves
        // `temp:` keys out, so it is the stored event's split too.
        let delta = ScopedState::split("event.actions.state_delta", &self.actions.state_delta)?;
        let stored = self.without_temp_state();
        let prepared = stored.prepare_split(delta, offload_bytes)?;
        Ok((stored, prepared))
    }

    /// Checks everything a store needs before writing, and returns the state
    /// delta split by scope together with the event's JSON payload.
    pub fn prepare(&self) -> Result<PreparedEvent, StoreError> {
        let delta = ScopedState::split("event.actions.state_delta", &self.actions.state_delta)?;
        self.prepare_split(delta, DEFAULT_MEDIA_OFFLOAD_BYTES)
    }

    /// [`Event::prepare`] with the state delta already split. The event is
    /// serialized once, to its payload; the size limits are checked by
    /// counting the bytes of the payload's compact text, never building it.
    fn prepare_split(&self, delta: ScopedState, offload_bytes: usize) -> Result<PreparedEvent, StoreError> {
        check_label("event.id", &self.id, MAX_ID_CHARS, false)?;
        // adk-core's own events may carry no author; the runner accepts them.
        check_label("event.author", &self.author, MAX_LABEL_CHARS, true)?;
        check_label("event.invocation_id", &self.invocation_id, MAX_LABEL_CHARS, true)?;
        if let Some(branch) = &self.branch {
            check_label("event.branch", branch, MAX_LABEL_CHARS * 4, true)?;
        }
        if self.redaction.is_some() {
            // A tombstone is made by the store, where it also writes the
            // audit row; appended, it would claim a redaction never made.
            return Err(StoreError::invalid("event.redaction", "is set by redact_event only"));
        }
        let event_ts = self.timestamp_nanos()?;
        let mut payload = serde_json::to_value(self).map_err(|e| StoreError::invalid("event", e.to_string()))?;
        let mut size = json_len(&payload);
        let mut blobs = Vec::new();
        // Only a payload this large can hold media this large, so a text
        // event never pays for the walk.
        if size > offload_bytes
            && let Some(content) = payload.get_mut("content")
        {
            blobs = offload(content, offload_bytes, "event.content")?;
            if !blobs.is_empty() {
                size = json_len(&payload);
            }
        }
        // A scope of the delta is written inside the payload (with shorter
        // keys), so it is never larger: below the state limit, no scope can
        // be over it.
        if size > MAX_STATE_BYTES {
            delta.check_sizes("event.actions.state_delta")?;
        }
        if contains_nul(&payload) {
            return Err(StoreError::invalid(
                "event",
                "contains a NUL character, which PostgreSQL cannot store in jsonb",
            ));
        }
        if size > MAX_EVENT_BYTES {
            return Err(StoreError::EventTooLarge { size, limit: MAX_EVENT_BYTES });
        }
        Ok(PreparedEvent { event_ts, delta, payload, blobs })
    }
}

impl Event {
    /// Checks a rollover summary and returns it as stored: never partial,
    /// and without a state delta (the successor starts from the closed
    /// session's state as it is).
    /// A summary keeps its media inline: it is text the model wrote.
    pub fn prepare_summary(self) -> Result<(Self, PreparedEvent), StoreError> {
        if self.is_partial() {
            return Err(StoreError::invalid("summary.partial", "a rollover summary cannot be partial"));
        }
        let (stored, prepared) = self.prepare_for_store_with(usize::MAX)?;
        if !prepared.delta.is_empty() {
            return Err(StoreError::invalid("summary.actions.state_delta", "a rollover summary cannot change state"));
        }
        Ok((stored, prepared))
    }
}

/// An event checked and split for writing.
#[derive(Debug, Clone)]
pub struct PreparedEvent {
    /// The event's time in nanoseconds since the epoch (`adk_events.event_ts`).
    pub event_ts: i64,
    /// The state delta split by scope, `temp:` keys dropped.
    pub delta: ScopedState,
    /// The event as stored, with references in place of its media.
    pub payload: Value,
    /// The media that left the payload, distinct and ordered by hash.
    pub blobs: Vec<Blob>,
}

/// Bytes of the compact JSON text of `value`, counted as it is written.
fn json_len(value: &Value) -> usize {
    struct Count(usize);
    impl std::io::Write for Count {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0 += buf.len();
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut count = Count(0);
    match serde_json::to_writer(&mut count, value) {
        Ok(()) => count.0,
        Err(_) => usize::MAX,
    }
}

fn check_label(field: &'static str, value: &str, max_chars: usize, may_be_empty: bool) -> Result<(), StoreError> {
    if !may_be_empty && value.trim().is_empty() {
        return Err(StoreError::invalid(field, "must not be empty"));
    }
    let chars = value.chars().count();
    if chars > max_chars {
        return Err(StoreError::invalid(field, format!("is {chars} characters, more than {max_chars}")));
    }
    if value.contains('\0') {
        return Err(StoreError::invalid(field, "contains a NUL character"));
    }
    Ok(())
}

/// Nanoseconds since the epoch, if the instant fits in an `i64`.
pub fn timestamp_to_nanos(ts: DateTime<Utc>) -> Option<i64> {
    ts.timestamp_nanos_opt()
}

/// The instant `nanos` after the epoch.
pub fn nanos_to_timestamp(nanos: i64) -> DateTime<Utc> {
    Utc.timestamp_nanos(nanos)
}

/// RFC 3339 with all nine fractional digits, so the text form never loses
/// precision and sorts as time does.
pub(crate) mod nanos_rfc3339 {
    use chrono::{DateTime, SecondsFormat, Utc};
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(ts: &DateTime<Utc>, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&ts.to_rfc3339_opts(SecondsFormat::Nanos, true))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<DateTime<Utc>, D::Error> {
        let text = String::deserialize(d)?;
        DateTime::parse_from_rfc3339(&text).map(|t| t.with_timezone(&Utc)).map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn unknown_fields_round_trip() {
        let input = json!({
            "id": "e1", "invocation_id": "i1", "author": "agent",
            "timestamp": "2026-11-30T10:00:00.123456789Z",
            "content": {"role": "model", "parts": [{"text": "hi"}]},
            "actions": {"state_delta": {"a": 1}, "requested_auth_configs": {}},
            "usage_metadata": {"total_token_count": 12},
            "long_running_tool_ids": ["t"]
        });
        let event = Event::from_value(input.clone()).unwrap();
        assert_eq!(event.timestamp.timestamp_subsec_nanos(), 123_456_789);
        assert_eq!(serde_json::to_value(&event).unwrap(), input);
    }

    #[test]
    fn malformed_json_names_the_event() {
        for text in ["{", "[]", r#"{"id": "x"}"#, r#"{"id":"x","author":"a","timestamp":"yesterday"}"#] {
            assert!(matches!(Event::from_json(text), Err(StoreError::InvalidInput { field, .. }) if field == "event"));
        }
    }

    #[test]
    fn prepare_names_bad_fields() {
        let mut e = Event::new("agent");
        e.id = String::new();
        assert!(matches!(e.prepare(), Err(StoreError::InvalidInput { field, .. }) if field == "event.id"));
        let mut e = Event::new("agent");
        e.content = Some(json!({"parts": [{"text": "a\u{0}"}]}));
        assert!(matches!(e.prepare(), Err(StoreError::InvalidInput { field, .. }) if field == "event"));
        let mut e = Event::new("agent");
        e.content = Some(json!("x".repeat(MAX_EVENT_BYTES)));
        assert!(matches!(e.prepare(), Err(StoreError::EventTooLarge { .. })));
    }

    #[test]
    fn an_oversize_delta_scope_is_refused_before_the_event() {
        let mut e = Event::new("agent");
        e.actions.state_delta = json!({"user:big": "x".repeat(70_000)}).as_object().cloned().unwrap();
        assert!(matches!(e.prepare(), Err(StoreError::StateTooLarge { field, .. }) if field.contains("user")));
        e.actions.state_delta = json!({"big": "x".repeat(MAX_EVENT_BYTES)}).as_object().cloned().unwrap();
        assert!(matches!(e.prepare(), Err(StoreError::StateTooLarge { field, .. }) if field.contains("session")));
        e.actions.state_delta =
            json!({"a": "x".repeat(40_000), "app:b": "x".repeat(40_000)}).as_object().cloned().unwrap();
        assert!(e.prepare().is_ok(), "each scope is under the limit");
    }

    #[test]
    fn payload_size_is_the_compact_text_length() {
        for value in [json!(null), json!({"a": [1, 2.5, "x\"\u{1}é🦀"], "b": {"c": true}}), json!("x".repeat(100))] {
            assert_eq!(json_len(&value), serde_json::to_vec(&value).unwrap().len());
        }
    }

    #[test]
    fn prepare_for_store_splits_the_delta_without_temp_keys() {
        let mut e = Event::new("agent");
        e.actions.state_delta = json!({"temp:x": 1, "y": 2, "user:u": 3}).as_object().cloned().unwrap();
        let (stored, prepared) = e.clone().prepare_for_store().unwrap();
        assert_eq!(prepared.delta, stored.prepare().unwrap().delta);
        assert_eq!(prepared.payload, serde_json::to_value(&stored).unwrap());
        assert_eq!(prepared.delta.user, json!({"u": 3}).as_object().cloned().unwrap());

        e.actions.state_delta = json!({"temp:": 1}).as_object().cloned().unwrap();
        assert!(e.prepare_for_store().is_err(), "a malformed temp: key is refused, not dropped");
    }

    #[test]
    fn temp_keys_leave_the_stored_event() {
        let mut e = Event::new("agent");
        e.actions.state_delta = json!({"temp:x": 1, "y": 2}).as_object().cloned().unwrap();
        let stored = e.without_temp_state();
        assert_eq!(stored.actions.state_delta, json!({"y": 2}).as_object().cloned().unwrap());
    }
}
