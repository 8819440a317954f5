//! adk events ⇄ store events, losslessly.
//!
//! The store types the fields it reads (id, invocation id, author,
//! timestamp, branch, content, the actions it applies, `partial`,
//! `turn_complete`) and keeps everything else in `extra`. The mapping goes
//! through the adk event's own serde form so that a field adk adds in a
//! later release is carried in `extra` without a change here.
//!
//! To keep the stored payload small, `extra` holds only what differs from a
//! blank adk event (`usage_metadata: null`, `interrupted: false`, empty
//! `long_running_tool_ids`, … are left out), and reading an event fills the
//! blanks back in from the same template. `false` flags and an empty branch
//! are stored as absent for the same reason. An event therefore reads back
//! equal, field for field and to the nanosecond, to the event appended.

use std::sync::OnceLock;

use adk_core::{AdkError, ErrorComponent};
use adk_postgres_domain::{Event, EventActions};
use chrono::SecondsFormat;
use serde_json::{Map, Value};

use crate::error::codes;
use crate::state::to_store_state;

/// Top-level fields of an adk event that the store event types.
const TYPED: [&str; 9] =
    ["id", "timestamp", "invocation_id", "branch", "author", "content", "partial", "turn_complete", "actions"];
/// Fields of adk `EventActions` that the store's `EventActions` types.
const TYPED_ACTIONS: [&str; 5] =
    ["state_delta", "artifact_delta", "transfer_to_agent", "escalate", "skip_summarization"];

/// The serde form of a blank adk event, without the typed fields: top level
/// and actions.
fn blank() -> &'static (Map<String, Value>, Map<String, Value>) {
    static BLANK: OnceLock<(Map<String, Value>, Map<String, Value>)> = OnceLock::new();
    BLANK.get_or_init(|| {
        let mut top = match serde_json::to_value(adk_core::Event::with_id("", "")) {
            Ok(Value::Object(map)) => map,
            // An adk event always serializes to an object; an empty template
            // only makes payloads larger, never wrong.
            _ => Map::new(),
        };
        let actions = match top.remove("actions") {
            Some(Value::Object(map)) => map,
            _ => Map::new(),
        };
        top.retain(|k, _| !TYPED.contains(&k.as_str()));
        let actions = actions.into_iter().filter(|(k, _)| !TYPED_ACTIONS.contains(&k.as_str())).collect();
        (top, actions)
    })
}

fn corrupt(id: &str, why: impl std::fmt::Display) -> AdkError {
    AdkError::internal(ErrorComponent::Session, codes::CORRUPT_EVENT, format!("event {id:?}: {why}"))
}

/// The store event for an adk event: every field carried, typed where the
/// store reads it, the rest in `extra`.
pub fn to_store_event(event: &adk_core::Event) -> Result<Event, AdkError> {
    let Value::Object(mut value) = serde_json::to_value(event).map_err(|e| corrupt(&event.id, e))? else {
        return Err(corrupt(&event.id, "does not serialize to a JSON object"));
    };
    let (blank_top, blank_actions) = blank();
    let actions_value = match value.remove("actions") {
        Some(Value::Object(map)) => map,
        _ => Map::new(),
    };
    let extra = value
        .into_iter()
        .filter(|(k, v)| !TYPED.contains(&k.as_str()) && blank_top.get(k) != Some(v))
        .collect::<Map<String, Value>>();
    let actions_extra = actions_value
        .into_iter()
        .filter(|(k, v)| !TYPED_ACTIONS.contains(&k.as_str()) && blank_actions.get(k) != Some(v))
        .collect::<Map<String, Value>>();

    let mut artifacts: Vec<(&String, &i64)> = event.actions.artifact_delta.iter().collect();
    artifacts.sort_unstable_by_key(|(k, _)| *k);
    let content = event.llm_response.content.as_ref().map(serde_json::to_value).transpose();
    Ok(Event {
        id: event.id.clone(),
        invocation_id: event.invocation_id.clone(),
        author: event.author.clone(),
        timestamp: event.timestamp,
        branch: Some(event.branch.clone()).filter(|b| !b.is_empty()),
        content: content.map_err(|e| corrupt(&event.id, e))?,
        actions: EventActions {
            state_delta: to_store_state(&event.actions.state_delta),
            artifact_delta: artifacts.into_iter().map(|(k, v)| (k.clone(), Value::from(*v))).collect(),
            transfer_to_agent: event.actions.transfer_to_agent.clone(),
            escalate: event.actions.escalate.then_some(true),
            skip_summarization: event.actions.skip_summarization.then_some(true),
            extra: actions_extra,
        },
        partial: event.llm_response.partial.then_some(true),
        turn_complete: event.llm_response.turn_complete.then_some(true),
        extra,
    })
}

/// The adk event for a stored event. Fields the store event lacks take an
/// adk event's defaults, so events written by other producers (a rollover
/// summary, another ADK) read too; content that is not adk `Content` is an
/// error naming the event, never silently dropped.
pub fn from_store_event(event: &Event) -> Result<adk_core::Event, AdkError> {
    let (blank_top, blank_actions) = blank();
    let mut top = blank_top.clone();
    top.extend(event.extra.iter().map(|(k, v)| (k.clone(), v.clone())));

    let mut actions = blank_actions.clone();
    let state_delta = event.actions.state_delta.clone();
    for (k, v) in &event.actions.extra {
        actions.insert(k.clone(), v.clone());
    }
    actions.insert("state_delta".into(), Value::Object(state_delta));
    actions.insert("artifact_delta".into(), Value::Object(event.actions.artifact_delta.clone()));
    actions
        .insert("transfer_to_agent".into(), event.actions.transfer_to_agent.clone().map_or(Value::Null, Value::from));
    actions.insert("escalate".into(), Value::Bool(event.actions.escalate.unwrap_or(false)));
    actions.insert("skip_summarization".into(), Value::Bool(event.actions.skip_summarization.unwrap_or(false)));

    top.insert("id".into(), Value::from(event.id.as_str()));
    top.insert("timestamp".into(), Value::from(event.timestamp.to_rfc3339_opts(SecondsFormat::Nanos, true)));
    top.insert("invocation_id".into(), Value::from(event.invocation_id.as_str()));
    top.insert("branch".into(), Value::from(event.branch.clone().unwrap_or_default()));
    top.insert("author".into(), Value::from(event.author.as_str()));
    top.insert("content".into(), event.content.clone().unwrap_or(Value::Null));
    top.insert("partial".into(), Value::Bool(event.partial.unwrap_or(false)));
    top.insert("turn_complete".into(), Value::Bool(event.turn_complete.unwrap_or(false)));
    top.insert("actions".into(), Value::Object(actions));

    let mut adk: adk_core::Event = serde_json::from_value(Value::Object(top)).map_err(|e| corrupt(&event.id, e))?;
    // Already exact through RFC 3339 with nine digits; set directly so the
    // instant never depends on a text round trip.
    adk.timestamp = event.timestamp;
    Ok(adk)
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use adk_core::{Content, FinishReason, Part, UsageMetadata};
    use chrono::{TimeZone, Utc};
    use serde_json::json;

    use super::*;

    fn rich_event() -> adk_core::Event {
        let mut e = adk_core::Event::with_id("e-1", "inv-1");
        e.timestamp = Utc.timestamp_nanos(1_790_000_000_123_456_789);
        e.author = "assistant".into();
        e.branch = "root.assistant".into();
        e.llm_response.content = Some(Content {
            role: "model".into(),
            parts: vec![
                Part::Text { text: "hi".into() },
                Part::FunctionCall {
                    name: "lookup".into(),
                    args: json!({"b": 1, "a": [1.5, null]}),
                    id: Some("call-1".into()),
                    thought_signature: None,
                },
            ],
        });
        e.llm_response.usage_metadata = Some(UsageMetadata {
            prompt_token_count: 3,
            candidates_token_count: 4,
            total_token_count: 7,
            ..UsageMetadata::default()
        });
        e.llm_response.finish_reason = Some(FinishReason::Stop);
        e.llm_response.turn_complete = true;
        e.llm_response.interrupted = true;
        e.llm_response.error_code = Some("E1".into());
        e.llm_response.provider_metadata = Some(json!({"response_id": "r"}));
        e.llm_response.interaction_id = Some("v1_x".into());
        e.actions.state_delta = HashMap::from([
            ("user:name".to_owned(), json!("Ada")),
            ("app:n".to_owned(), json!(1)),
            ("s".to_owned(), json!(null)),
        ]);
        e.actions.artifact_delta = HashMap::from([("report.pdf".to_owned(), 2)]);
        e.actions.transfer_to_agent = Some("billing".into());
        e.actions.escalate = true;
        e.actions.skip_summarization = true;
        e.actions.route = Some(vec!["next".into()]);
        e.long_running_tool_ids = vec!["call-1".into()];
        e.llm_request = Some("{\"model\":\"m\"}".into());
        e.provider_metadata = HashMap::from([("k".to_owned(), "v".to_owned())]);
        e
    }

    fn through_json(event: &Event) -> Event {
        Event::from_value(serde_json::to_value(event).unwrap()).unwrap()
    }

    #[test]
    fn every_field_round_trips_through_the_stored_json() {
        for original in [rich_event(), adk_core::Event::with_id("e-2", "")] {
            let stored = to_store_event(&original).unwrap();
            let back = from_store_event(&through_json(&stored)).unwrap();
            assert_eq!(serde_json::to_value(&back).unwrap(), serde_json::to_value(&original).unwrap());
            assert_eq!(back.timestamp, original.timestamp);
        }
    }

    #[test]
    fn typed_fields_are_typed_and_blanks_are_left_out() {
        let stored = to_store_event(&rich_event()).unwrap();
        assert_eq!(stored.timestamp.timestamp_subsec_nanos(), 123_456_789);
        assert_eq!(stored.branch.as_deref(), Some("root.assistant"));
        assert_eq!(stored.content.as_ref().unwrap()["role"], "model");
        assert_eq!(stored.actions.state_delta.keys().collect::<Vec<_>>(), ["app:n", "s", "user:name"]);
        assert_eq!(stored.actions.escalate, Some(true));
        assert_eq!(stored.turn_complete, Some(true));
        assert_eq!(stored.partial, None);
        assert_eq!(stored.extra["long_running_tool_ids"], json!(["call-1"]));
        assert_eq!(stored.actions.extra["route"], json!(["next"]));

        let blank = to_store_event(&adk_core::Event::with_id("e", "i")).unwrap();
        assert!(blank.extra.is_empty(), "{:?}", blank.extra);
        assert!(blank.actions.extra.is_empty(), "{:?}", blank.actions.extra);
        assert_eq!((blank.branch, blank.content, blank.partial), (None, None, None));
    }

    #[test]
    fn foreign_events_read_with_adk_defaults() {
        let mut foreign = Event::new("system");
        foreign.content = Some(json!({"role": "model", "parts": [{"text": "summary"}]}));
        let adk = from_store_event(&foreign).unwrap();
        assert_eq!(adk.author, "system");
        assert!(!adk.llm_response.interrupted && adk.long_running_tool_ids.is_empty());

        foreign.content = Some(json!("not content"));
        assert_eq!(from_store_event(&foreign).unwrap_err().code, codes::CORRUPT_EVENT);
    }
}
