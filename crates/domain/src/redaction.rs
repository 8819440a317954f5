//! Redacting one event: its content, and any other text it carries, replaced
//! by a tombstone that keeps the conversation's shape (`SessionStore::redact_event`).
//!
//! The tombstone is stated twice, here for the in-memory store and in
//! `crates/schema/sql/redact.sql` for PostgreSQL; the conformance suite
//! holds both to the same stored JSON.
//!
//! What a redacted event keeps, and nothing else:
//! - identity, ordering and timing: `id`, `invocation_id`, `author`,
//!   `timestamp`, `branch`, `partial`, `turn_complete` (the store keeps the
//!   seq and arrival time in their own columns);
//! - `content` as valid adk `Content`: the same role (else `user` for a user
//!   event, `model` otherwise) and one text part, [`REDACTED_TEXT`]; an event
//!   without content stays without;
//! - `actions.state_delta` (unless [`RedactOptions::state_delta`]), and the
//!   control flow flags `transfer_to_agent`, `escalate`, `skip_summarization`;
//! - what the usage rollup reads: `usage_metadata` (counts and cost) and
//!   `error_code`, plus, in the tombstone, the kind and payload size the
//!   rollup had read from the original (`redaction.usage`).
//!
//! Everything else goes: `error_message`, `citation_metadata`,
//! grounding and provider metadata, `event_metadata`, `llm_request`,
//! `long_running_tool_ids`, `finish_reason`, `artifact_delta`, and the other
//! actions (tool confirmations, compaction, routes), and every field
//! another producer added.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value, json};

use crate::error::StoreError;
use crate::event::{Event, EventActions};

/// The one text part a redacted event's content holds.
pub const REDACTED_TEXT: &str = "[redacted]";

/// Longest redaction reason, in characters.
pub const MAX_REASON_CHARS: usize = 256;

/// Top-level fields of a payload a tombstone keeps besides the typed ones:
/// what the usage rollup reads (`crates/schema/sql/usage.sql`).
pub const KEPT_EXTRA: [&str; 2] = ["usage_metadata", "error_code"];

/// How a redaction was made, on the redacted event (`Event::redaction`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Redaction {
    /// Why, as the caller said it.
    pub reason: String,
    /// When, to the microsecond, in UTC.
    #[serde(with = "crate::event::nanos_rfc3339")]
    pub redacted_at: DateTime<Utc>,
    /// Whether the state delta was removed too; when it was, rewind and
    /// fork rebuild state without this event's session-scoped keys.
    #[serde(default)]
    pub state_delta: bool,
    /// What the store keeps for its own jobs: the PostgreSQL store records
    /// `usage` (`kind`, `payload_bytes`), the original's figures for the
    /// usage rollup.
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

/// What a redaction removes besides the content and the other text.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RedactOptions {
    /// Remove `actions.state_delta` too. Off by default, so that rewind and
    /// fork still rebuild the same state; on, they rebuild it without this
    /// event's keys. The session's current state, app and user state are
    /// never changed by a redaction.
    pub state_delta: bool,
}

/// What `redact_event` answers.
#[derive(Debug, Clone, PartialEq)]
pub struct Redacted {
    /// The event's seq, unchanged.
    pub seq: u64,
    /// The event as it is now stored.
    pub event: Event,
    /// The event was redacted before and this call changed nothing.
    pub already_redacted: bool,
}

/// Checks a redaction reason: 1 to [`MAX_REASON_CHARS`] characters, not
/// only whitespace, no control character.
pub fn check_reason(reason: &str) -> Result<(), StoreError> {
    if reason.trim().is_empty() {
        return Err(StoreError::invalid("reason", "must not be empty"));
    }
    let chars = reason.chars().count();
    if chars > MAX_REASON_CHARS {
        return Err(StoreError::invalid("reason", format!("is {chars} characters, more than {MAX_REASON_CHARS}")));
    }
    if reason.chars().any(char::is_control) {
        return Err(StoreError::invalid("reason", "contains a control character"));
    }
    Ok(())
}

/// Checks the id of the event to redact.
pub fn check_event_id(event_id: &str) -> Result<(), StoreError> {
    if event_id.trim().is_empty() {
        return Err(StoreError::invalid("event_id", "must not be empty"));
    }
    if event_id.chars().count() > crate::ids::MAX_ID_CHARS || event_id.contains('\0') {
        return Err(StoreError::invalid("event_id", "is not an event id the store could hold"));
    }
    Ok(())
}

impl Event {
    /// Whether this event is a tombstone left by a redaction.
    pub fn is_redacted(&self) -> bool {
        self.redaction.is_some()
    }

    /// The tombstone of this event (see the module's documentation for what
    /// it keeps). Redacting a redacted event keeps its first tombstone,
    /// unless the state delta is removed now: then the new reason and time
    /// replace the old ones.
    pub fn redacted(self, reason: &str, at: DateTime<Utc>, options: RedactOptions) -> Event {
        let state_delta = options.state_delta || self.redaction.as_ref().is_some_and(|r| r.state_delta);
        let extra_of_the_store = self.redaction.map(|r| r.extra).unwrap_or_default();
        let content = self.content.filter(|c| !c.is_null()).map(|c| {
            let role = match c.get("role") {
                Some(Value::String(role)) => role.clone(),
                _ if self.author == "user" => "user".to_owned(),
                _ => "model".to_owned(),
            };
            json!({ "role": role, "parts": [{ "text": REDACTED_TEXT }] })
        });
        let extra = self.extra.into_iter().filter(|(k, _)| KEPT_EXTRA.contains(&k.as_str())).collect();
        Event {
            id: self.id,
            invocation_id: self.invocation_id,
            author: self.author,
            timestamp: self.timestamp,
            branch: self.branch,
            content,
            actions: EventActions {
                state_delta: if state_delta { Map::new() } else { self.actions.state_delta },
                artifact_delta: Map::new(),
                transfer_to_agent: self.actions.transfer_to_agent,
                escalate: self.actions.escalate,
                skip_summarization: self.actions.skip_summarization,
                extra: Map::new(),
            },
            partial: self.partial,
            turn_complete: self.turn_complete,
            redaction: Some(Redaction {
                reason: reason.to_owned(),
                redacted_at: at,
                state_delta,
                extra: extra_of_the_store,
            }),
            extra,
        }
    }

    /// Whether redacting this event with `options` would change nothing.
    pub fn redaction_covers(&self, options: RedactOptions) -> bool {
        self.redaction.as_ref().is_some_and(|r| r.state_delta || !options.state_delta)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rich() -> Event {
        Event::from_value(json!({
            "id": "e1", "invocation_id": "i1", "author": "agent", "branch": "root",
            "timestamp": "2026-11-30T10:00:00.123456789Z",
            "content": {"role": "model", "parts": [{"text": "my card is 4111"}, {"functionCall": {"name": "f", "args": {"pan": "4111"}}}]},
            "actions": {"state_delta": {"a": 1}, "artifact_delta": {"passport.png": 1}, "escalate": true,
                        "tool_confirmation": {"hint": "secret"}},
            "usage_metadata": {"total_token_count": 12},
            "error_code": "SAFETY", "error_message": "you said 4111",
            "citation_metadata": {"citation_sources": [{"uri": "x"}]},
            "event_metadata": {"k": "v"}, "turn_complete": true
        }))
        .unwrap()
    }

    #[test]
    fn a_tombstone_keeps_identity_state_and_usage_and_nothing_else() {
        let at = Utc::now();
        let t = rich().redacted("pii", at, RedactOptions::default());
        let value = serde_json::to_value(&t).unwrap();
        assert_eq!(value["content"], json!({"role": "model", "parts": [{"text": "[redacted]"}]}));
        assert_eq!(value["actions"], json!({"state_delta": {"a": 1}, "escalate": true}));
        assert_eq!(value["usage_metadata"], json!({"total_token_count": 12}));
        assert_eq!(value["error_code"], json!("SAFETY"));
        assert!(!value.to_string().contains("4111"), "{value}");
        assert!(value.get("citation_metadata").is_none() && value.get("event_metadata").is_none());
        assert_eq!((t.id.as_str(), t.branch.as_deref(), t.turn_complete), ("e1", Some("root"), Some(true)));
        assert_eq!(Event::from_value(value).unwrap(), t, "the tombstone reads back as it was written");

        let again = t.clone().redacted("other", Utc::now(), RedactOptions { state_delta: true });
        assert!(again.actions.state_delta.is_empty());
        assert!(again.redaction.as_ref().is_some_and(|r| r.state_delta && r.reason == "other"));
        assert!(again.redaction_covers(RedactOptions { state_delta: true }));
        assert!(
            t.redaction_covers(RedactOptions::default()) && !t.redaction_covers(RedactOptions { state_delta: true })
        );
    }

    #[test]
    fn reasons_and_ids_are_checked() {
        for bad in ["", "  ", "a\u{0}b", "tab\there"] {
            assert!(matches!(check_reason(bad), Err(StoreError::InvalidInput { field, .. }) if field == "reason"));
        }
        let long = "x".repeat(MAX_REASON_CHARS + 1);
        assert!(matches!(check_reason(&long), Err(StoreError::InvalidInput { field, .. }) if field == "reason"));
        assert!(check_reason(&"é".repeat(MAX_REASON_CHARS)).is_ok());
        assert!(matches!(check_event_id(" "), Err(StoreError::InvalidInput { field, .. }) if field == "event_id"));
    }
}
