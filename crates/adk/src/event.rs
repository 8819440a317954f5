//! adk events ⇄ store events, losslessly.
//!
//! The store types the fields it reads (id, invocation id, author,
//! timestamp, branch, content, the actions it applies, `partial`,
//! `turn_complete`) and keeps everything else in `extra`, under the key and
//! in the JSON form adk's own serde gives it (`usage_metadata`,
//! `long_running_tool_ids`, `event_metadata`, `actions.route`, …).
//!
//! The mapping is field by field, with no JSON tree of the whole event in
//! between: only the content and the untyped fields that are set become
//! JSON. Every adk struct is destructured without `..`, so a field a later
//! adk release adds fails to compile here instead of being dropped.
//!
//! To keep the stored payload small, `extra` holds only what differs from a
//! blank adk event (`usage_metadata: null`, `interrupted: false`, empty
//! `long_running_tool_ids`, … are left out), and reading an event takes a
//! blank adk event's value for whatever is absent. `false` flags and an
//! empty branch are stored as absent for the same reason. Keys of `extra`
//! adk does not know are ignored on reading, as adk's serde would. An event
//! therefore reads back equal, field for field and to the nanosecond, to the
//! event appended.

use std::collections::HashMap;

use adk_core::{AdkError, Content, ErrorComponent, LlmResponse, Part};
use adk_postgres_domain::{Event, EventActions};
use serde_json::{Map, Value};

use crate::error::codes;
use crate::state::to_store_state;

pub(crate) fn corrupt(id: &str, why: impl std::fmt::Display) -> AdkError {
    AdkError::internal(ErrorComponent::Session, codes::CORRUPT_EVENT, format!("event {id:?}: {why}"))
}

/// The outcome of (de)serializing one field, the field named in the error.
fn field<T>(id: &str, name: &str, result: serde_json::Result<T>) -> Result<T, AdkError> {
    result.map_err(|e| corrupt(id, format_args!("{name}: {e}")))
}

fn strings(items: &[String]) -> Value {
    Value::Array(items.iter().map(|s| Value::from(s.as_str())).collect())
}

/// adk `Content` from its JSON, as its serde reads it. Plain text parts, the
/// common case, are built directly: `Part` is untagged, so serde would buffer
/// each part and try `Thinking` before `Text`.
fn to_content(value: Value) -> serde_json::Result<Content> {
    let plain = matches!(&value, Value::Object(map) if map.len() == 2
        && matches!(map.get("role"), Some(Value::String(_)))
        && matches!(map.get("parts"), Some(Value::Array(_))));
    if !plain {
        return serde_json::from_value(value);
    }
    let (mut role, mut parts) = (String::new(), Vec::new());
    if let Value::Object(map) = value {
        for (_, value) in map {
            match value {
                Value::String(text) => role = text,
                Value::Array(items) => parts = items,
                _ => {}
            }
        }
    }
    let parts = parts.into_iter().map(to_part).collect::<serde_json::Result<_>>()?;
    Ok(Content { role, parts })
}

pub(crate) fn to_part(value: Value) -> serde_json::Result<Part> {
    match value {
        Value::Object(mut map) if map.len() == 1 => match map.remove("text") {
            Some(Value::String(text)) => Ok(Part::Text { text }),
            Some(other) => {
                map.insert("text".into(), other);
                serde_json::from_value(Value::Object(map))
            }
            None => serde_json::from_value(Value::Object(map)),
        },
        other => serde_json::from_value(other),
    }
}

/// Where a redacted event's redaction shows on the adk event: its
/// `provider_metadata` (serialized as `event_metadata`), a string map adk
/// carries untouched. The reason, as given.
pub const REDACTION_REASON: &str = "adk_postgres.redaction.reason";
/// When it was redacted: RFC 3339, UTC, nine fractional digits.
pub const REDACTION_AT: &str = "adk_postgres.redaction.redacted_at";
/// `"true"` when the state delta was removed too, else `"false"`.
pub const REDACTION_STATE_DELTA: &str = "adk_postgres.redaction.state_delta";

/// A redacted event's redaction, shown in its adk `provider_metadata`. A
/// tombstone keeps no event_metadata of its own (it may carry text), so
/// these keys are the redaction's alone.
pub(crate) fn show_redaction(redaction: adk_postgres_domain::Redaction, event_metadata: &mut HashMap<String, String>) {
    event_metadata.insert(REDACTION_REASON.to_owned(), redaction.reason);
    event_metadata
        .insert(REDACTION_AT.to_owned(), redaction.redacted_at.to_rfc3339_opts(chrono::SecondsFormat::Nanos, true));
    event_metadata.insert(REDACTION_STATE_DELTA.to_owned(), redaction.state_delta.to_string());
}

/// The store event for an adk event: every field carried, typed where the
/// store reads it, the rest in `extra` when it is not blank.
pub fn to_store_event(event: &adk_core::Event) -> Result<Event, AdkError> {
    let adk_core::Event {
        id,
        timestamp,
        invocation_id,
        branch,
        author,
        llm_response,
        actions,
        long_running_tool_ids,
        llm_request,
        provider_metadata: event_metadata,
    } = event;
    let LlmResponse {
        content,
        usage_metadata,
        finish_reason,
        citation_metadata,
        partial,
        turn_complete,
        interrupted,
        error_code,
        error_message,
        provider_metadata,
        interaction_id,
    } = llm_response;
    let adk_core::EventActions {
        state_delta,
        artifact_delta,
        skip_summarization,
        transfer_to_agent,
        escalate,
        tool_confirmation,
        tool_confirmation_decision,
        compaction,
        route,
    } = actions;

    // In the order adk's serde writes them.
    let mut extra = Map::new();
    if let Some(usage) = usage_metadata {
        extra.insert("usage_metadata".into(), field(id, "usage_metadata", serde_json::to_value(usage))?);
    }
    if let Some(reason) = finish_reason {
        extra.insert("finish_reason".into(), field(id, "finish_reason", serde_json::to_value(reason))?);
    }
    if let Some(citations) = citation_metadata {
        extra.insert("citation_metadata".into(), field(id, "citation_metadata", serde_json::to_value(citations))?);
    }
    if *interrupted {
        extra.insert("interrupted".into(), Value::Bool(true));
    }
    if let Some(code) = error_code {
        extra.insert("error_code".into(), Value::from(code.as_str()));
    }
    if let Some(message) = error_message {
        extra.insert("error_message".into(), Value::from(message.as_str()));
    }
    if let Some(metadata) = provider_metadata {
        extra.insert("provider_metadata".into(), metadata.clone());
    }
    if let Some(interaction) = interaction_id {
        extra.insert("interaction_id".into(), Value::from(interaction.as_str()));
    }
    if !long_running_tool_ids.is_empty() {
        extra.insert("long_running_tool_ids".into(), strings(long_running_tool_ids));
    }
    if let Some(request) = llm_request {
        extra.insert("llm_request".into(), Value::from(request.as_str()));
    }
    if !event_metadata.is_empty() {
        // Keys sorted, so the stored JSON does not depend on a `HashMap`'s
        // iteration order.
        let mut entries: Vec<(&String, &String)> = event_metadata.iter().collect();
        entries.sort_unstable_by_key(|(k, _)| *k);
        let map = entries.into_iter().map(|(k, v)| (k.clone(), Value::from(v.as_str()))).collect();
        extra.insert("event_metadata".into(), Value::Object(map));
    }

    let mut actions_extra = Map::new();
    if let Some(request) = tool_confirmation {
        actions_extra
            .insert("tool_confirmation".into(), field(id, "actions.tool_confirmation", serde_json::to_value(request))?);
    }
    if let Some(decision) = tool_confirmation_decision {
        actions_extra.insert(
            "tool_confirmation_decision".into(),
            field(id, "actions.tool_confirmation_decision", serde_json::to_value(decision))?,
        );
    }
    if let Some(compaction) = compaction {
        actions_extra.insert("compaction".into(), field(id, "actions.compaction", serde_json::to_value(compaction))?);
    }
    if let Some(route) = route {
        actions_extra.insert("route".into(), strings(route));
    }

    let mut artifacts: Vec<(&String, &i64)> = artifact_delta.iter().collect();
    artifacts.sort_unstable_by_key(|(k, _)| *k);
    Ok(Event {
        id: id.clone(),
        invocation_id: invocation_id.clone(),
        author: author.clone(),
        timestamp: *timestamp,
        branch: Some(branch.clone()).filter(|b| !b.is_empty()),
        content: content.as_ref().map(|c| field(id, "content", serde_json::to_value(c))).transpose()?,
        actions: EventActions {
            state_delta: to_store_state(state_delta),
            artifact_delta: artifacts.into_iter().map(|(k, v)| (k.clone(), Value::from(*v))).collect(),
            transfer_to_agent: transfer_to_agent.clone(),
            escalate: escalate.then_some(true),
            skip_summarization: skip_summarization.then_some(true),
            extra: actions_extra,
        },
        partial: partial.then_some(true),
        turn_complete: turn_complete.then_some(true),
        redaction: None,
        extra,
    })
}

/// The adk event for a stored event. Fields the store event lacks take an
/// adk event's defaults, so events written by other producers (a rollover
/// summary, another ADK) read too; content that is not adk `Content` is an
/// error naming the event, never silently dropped.
pub fn from_store_event(event: &Event) -> Result<adk_core::Event, AdkError> {
    into_adk_event(event.clone())
}

/// [`from_store_event`] on an owned event: its strings and JSON move into the
/// adk event instead of being copied.
pub(crate) fn into_adk_event(event: Event) -> Result<adk_core::Event, AdkError> {
    let Event {
        id,
        invocation_id,
        author,
        timestamp,
        branch,
        content,
        actions,
        partial,
        turn_complete,
        redaction,
        extra,
    } = event;
    let EventActions {
        state_delta,
        artifact_delta,
        transfer_to_agent,
        escalate,
        skip_summarization,
        extra: actions_extra,
    } = actions;

    let mut llm_response = LlmResponse {
        // JSON null is what adk writes for no content.
        content: content.filter(|c| !c.is_null()).map(|c| field(&id, "content", to_content(c))).transpose()?,
        partial: partial.unwrap_or(false),
        turn_complete: turn_complete.unwrap_or(false),
        ..LlmResponse::default()
    };
    let mut long_running_tool_ids = Vec::new();
    let mut llm_request = None;
    let mut event_metadata = HashMap::new();
    for (key, value) in extra {
        match key.as_str() {
            "usage_metadata" => llm_response.usage_metadata = field(&id, &key, serde_json::from_value(value))?,
            "finish_reason" => llm_response.finish_reason = field(&id, &key, serde_json::from_value(value))?,
            "citation_metadata" => llm_response.citation_metadata = field(&id, &key, serde_json::from_value(value))?,
            "interrupted" => llm_response.interrupted = field(&id, &key, serde_json::from_value(value))?,
            "error_code" => llm_response.error_code = field(&id, &key, serde_json::from_value(value))?,
            "error_message" => llm_response.error_message = field(&id, &key, serde_json::from_value(value))?,
            "provider_metadata" => llm_response.provider_metadata = field(&id, &key, serde_json::from_value(value))?,
            "interaction_id" => llm_response.interaction_id = field(&id, &key, serde_json::from_value(value))?,
            "long_running_tool_ids" => long_running_tool_ids = field(&id, &key, serde_json::from_value(value))?,
            "llm_request" => llm_request = field(&id, &key, serde_json::from_value(value))?,
            "event_metadata" => event_metadata = field(&id, &key, serde_json::from_value(value))?,
            _ => {}
        }
    }

    if let Some(redaction) = redaction {
        show_redaction(redaction, &mut event_metadata);
    }

    let mut actions = adk_core::EventActions {
        state_delta: state_delta.into_iter().collect(),
        artifact_delta: artifact_delta
            .into_iter()
            .map(|(k, v)| field(&id, "actions.artifact_delta", serde_json::from_value(v)).map(|v| (k, v)))
            .collect::<Result<_, _>>()?,
        skip_summarization: skip_summarization.unwrap_or(false),
        transfer_to_agent,
        escalate: escalate.unwrap_or(false),
        ..adk_core::EventActions::default()
    };
    for (key, value) in actions_extra {
        match key.as_str() {
            "tool_confirmation" => {
                actions.tool_confirmation = field(&id, "actions.tool_confirmation", serde_json::from_value(value))?
            }
            "tool_confirmation_decision" => {
                actions.tool_confirmation_decision =
                    field(&id, "actions.tool_confirmation_decision", serde_json::from_value(value))?;
            }
            "compaction" => actions.compaction = field(&id, "actions.compaction", serde_json::from_value(value))?,
            "route" => actions.route = field(&id, "actions.route", serde_json::from_value(value))?,
            _ => {}
        }
    }

    Ok(adk_core::Event {
        id,
        timestamp,
        invocation_id,
        branch: branch.unwrap_or_default(),
        author,
        llm_response,
        actions,
        long_running_tool_ids,
        llm_request,
        provider_metadata: event_metadata,
    })
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use adk_core::{
        CitationMetadata, CitationSource, Content, EventCompaction, FinishReason, FunctionResponseData, Part,
        ToolConfirmationDecision, ToolConfirmationRequest, UsageMetadata,
    };
    use chrono::{TimeZone, Utc};
    use serde_json::json;

    use super::*;

    /// The conversion as it was before it went field by field: through the
    /// adk event's serde form and a blank template. Kept to pin that the
    /// stored form and what reads back did not change.
    mod reference {
        use std::sync::OnceLock;

        use chrono::SecondsFormat;

        use super::super::{corrupt, to_store_state};
        use super::*;

        const TYPED: [&str; 9] =
            ["id", "timestamp", "invocation_id", "branch", "author", "content", "partial", "turn_complete", "actions"];
        const TYPED_ACTIONS: [&str; 5] =
            ["state_delta", "artifact_delta", "transfer_to_agent", "escalate", "skip_summarization"];

        fn blank() -> &'static (Map<String, Value>, Map<String, Value>) {
            static BLANK: OnceLock<(Map<String, Value>, Map<String, Value>)> = OnceLock::new();
            BLANK.get_or_init(|| {
                let Ok(Value::Object(mut top)) = serde_json::to_value(adk_core::Event::with_id("", "")) else {
                    unreachable!()
                };
                let Some(Value::Object(actions)) = top.remove("actions") else { unreachable!() };
                top.retain(|k, _| !TYPED.contains(&k.as_str()));
                let actions = actions.into_iter().filter(|(k, _)| !TYPED_ACTIONS.contains(&k.as_str())).collect();
                (top, actions)
            })
        }

        pub fn to_store_event(event: &adk_core::Event) -> Result<Event, AdkError> {
            let Value::Object(mut value) = serde_json::to_value(event).map_err(|e| corrupt(&event.id, e))? else {
                unreachable!()
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
                redaction: None,
                extra,
            })
        }

        pub fn from_store_event(event: &Event) -> Result<adk_core::Event, AdkError> {
            let (blank_top, blank_actions) = blank();
            let mut top = blank_top.clone();
            top.extend(event.extra.iter().map(|(k, v)| (k.clone(), v.clone())));
            let mut actions = blank_actions.clone();
            for (k, v) in &event.actions.extra {
                actions.insert(k.clone(), v.clone());
            }
            actions.insert("state_delta".into(), Value::Object(event.actions.state_delta.clone()));
            actions.insert("artifact_delta".into(), Value::Object(event.actions.artifact_delta.clone()));
            actions.insert(
                "transfer_to_agent".into(),
                event.actions.transfer_to_agent.clone().map_or(Value::Null, Value::from),
            );
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
            let mut adk: adk_core::Event =
                serde_json::from_value(Value::Object(top)).map_err(|e| corrupt(&event.id, e))?;
            adk.timestamp = event.timestamp;
            Ok(adk)
        }
    }

    fn rich_event() -> adk_core::Event {
        let mut e = adk_core::Event::with_id("e-1", "inv-1");
        e.timestamp = Utc.timestamp_nanos(1_790_000_000_123_456_789);
        e.author = "assistant".into();
        e.branch = "root.assistant".into();
        e.llm_response.content = Some(Content {
            role: "model".into(),
            parts: vec![
                Part::Thinking { thinking: "hmm".into(), signature: Some("sig".into()) },
                Part::Text { text: "hi".into() },
                Part::FunctionCall {
                    name: "lookup".into(),
                    args: json!({"b": 1, "a": [1.5, null]}),
                    id: Some("call-1".into()),
                    thought_signature: Some("ts".into()),
                },
                Part::FunctionResponse {
                    function_response: FunctionResponseData::new("lookup", json!({"ok": true})),
                    id: Some("call-1".into()),
                    annotations: Some(json!({"audience": ["user"]})),
                },
                Part::InlineData {
                    mime_type: "image/png".into(),
                    data: vec![0, 1, 255],
                    uri: Some("file:///a.png".into()),
                    annotations: None,
                },
                Part::FileData { mime_type: "text/plain".into(), file_uri: "gs://b/o".into(), annotations: None },
                Part::ServerToolCall { server_tool_call: json!({"tool": "search"}) },
                Part::ServerToolResponse { server_tool_response: json!({"hits": 2}) },
            ],
        });
        e.llm_response.usage_metadata = Some(UsageMetadata {
            prompt_token_count: 3,
            candidates_token_count: 4,
            total_token_count: 7,
            thinking_token_count: Some(2),
            cost: Some(0.000_125),
            is_byok: Some(false),
            provider_usage: Some(json!({"grounding": {"queries": 1}})),
            ..UsageMetadata::default()
        });
        e.llm_response.finish_reason = Some(FinishReason::Stop);
        e.llm_response.citation_metadata = Some(CitationMetadata {
            citation_sources: vec![CitationSource {
                uri: Some("https://example.com".into()),
                title: Some("Example".into()),
                start_index: Some(0),
                end_index: Some(2),
                license: None,
                publication_date: None,
            }],
        });
        e.llm_response.turn_complete = true;
        e.llm_response.interrupted = true;
        e.llm_response.error_code = Some("E1".into());
        e.llm_response.error_message = Some("over quota".into());
        e.llm_response.provider_metadata = Some(json!({"response_id": "r", "grounding_metadata": {"chunks": []}}));
        e.llm_response.interaction_id = Some("v1_x".into());
        e.actions.state_delta = HashMap::from([
            ("user:name".to_owned(), json!("Ada")),
            ("app:n".to_owned(), json!(1)),
            ("s".to_owned(), json!(null)),
        ]);
        e.actions.artifact_delta = HashMap::from([("report.pdf".to_owned(), 2), ("b".to_owned(), -1)]);
        e.actions.transfer_to_agent = Some("billing".into());
        e.actions.escalate = true;
        e.actions.skip_summarization = true;
        e.actions.tool_confirmation = Some(ToolConfirmationRequest {
            tool_name: "delete".into(),
            function_call_id: Some("call-2".into()),
            args: json!({"path": "/tmp/x"}),
        });
        e.actions.tool_confirmation_decision = Some(ToolConfirmationDecision::Deny);
        e.actions.compaction = Some(EventCompaction {
            start_timestamp: Utc.timestamp_nanos(1_790_000_000_000_000_001),
            end_timestamp: Utc.timestamp_nanos(1_790_000_000_100_000_000),
            compacted_content: Content { role: "model".into(), parts: vec![Part::Text { text: "sum".into() }] },
        });
        e.actions.route = Some(vec!["next".into()]);
        e.long_running_tool_ids = vec!["call-1".into(), "call-2".into()];
        e.llm_request = Some("{\"model\":\"m\"}".into());
        e.provider_metadata = HashMap::from([("k".to_owned(), "v".to_owned()), ("a".to_owned(), "b".to_owned())]);
        e
    }

    fn through_json(event: &Event) -> Event {
        Event::from_value(serde_json::to_value(event).unwrap()).unwrap()
    }

    fn adk_json(event: &adk_core::Event) -> Value {
        serde_json::to_value(event).unwrap()
    }

    /// The JSON text PostgreSQL sends for a jsonb value: keys ordered by
    /// length, then bytes, at every level, with its spacing.
    fn as_jsonb_text(event: &Event) -> Vec<u8> {
        fn reorder(value: Value) -> Value {
            match value {
                Value::Object(map) => {
                    let mut entries: Vec<(String, Value)> = map.into_iter().collect();
                    entries.sort_by(|(a, _), (b, _)| a.len().cmp(&b.len()).then_with(|| a.cmp(b)));
                    Value::Object(entries.into_iter().map(|(k, v)| (k, reorder(v))).collect())
                }
                Value::Array(items) => Value::Array(items.into_iter().map(reorder).collect()),
                other => other,
            }
        }
        let text = serde_json::to_string_pretty(&reorder(serde_json::to_value(event).unwrap())).unwrap();
        text.into_bytes()
    }

    /// The get's reading of a stored event, which must agree with
    /// [`from_store_event`] on what it reads.
    fn read_directly(event: &Event) -> serde_json::Result<adk_core::Event> {
        crate::event_json::direct(&as_jsonb_text(event))
    }

    /// A small deterministic generator, so the property tests need no
    /// dependency and every failure reproduces.
    struct Rng(u64);

    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0
        }
        fn below(&mut self, n: u64) -> u64 {
            self.next() % n
        }
        fn coin(&mut self) -> bool {
            self.below(2) == 0
        }
        fn text(&mut self) -> String {
            let alphabet = ["a", "Z", "0", " ", "é", "\"", "\\", "\n", "日", "🦀", ":", "/"];
            (0..self.below(6)).map(|_| alphabet[self.below(alphabet.len() as u64) as usize]).collect()
        }
        fn maybe_text(&mut self) -> Option<String> {
            self.coin().then(|| self.text())
        }
        fn json(&mut self, depth: u32) -> Value {
            match self.below(if depth == 0 { 5 } else { 7 }) {
                0 => Value::Null,
                1 => Value::Bool(self.coin()),
                2 => json!(self.next() as i64 >> self.below(60)),
                3 => json!((self.next() as f64) / 7.0e15),
                4 => Value::String(self.text()),
                5 => Value::Array((0..self.below(4)).map(|_| self.json(depth - 1)).collect()),
                _ => Value::Object((0..self.below(4)).map(|_| (self.text(), self.json(depth - 1))).collect()),
            }
        }
        fn strings(&mut self) -> Vec<String> {
            (0..self.below(3)).map(|_| self.text()).collect()
        }
        fn part(&mut self) -> Part {
            match self.below(8) {
                0 => Part::Text { text: self.text() },
                1 => Part::Thinking { thinking: self.text(), signature: self.maybe_text() },
                2 => Part::FunctionCall {
                    name: format!("f{}", self.text()),
                    args: self.json(2),
                    id: self.maybe_text(),
                    thought_signature: self.maybe_text(),
                },
                3 => Part::FunctionResponse {
                    function_response: FunctionResponseData::new(format!("f{}", self.text()), self.json(2)),
                    id: self.maybe_text(),
                    annotations: self.coin().then(|| json!({"k": self.text()})),
                },
                4 => Part::InlineData {
                    mime_type: "application/octet-stream".into(),
                    data: (0..self.below(5)).map(|_| self.next() as u8).collect(),
                    uri: self.maybe_text(),
                    annotations: None,
                },
                5 => Part::FileData { mime_type: "text/plain".into(), file_uri: self.text(), annotations: None },
                6 => Part::ServerToolCall { server_tool_call: json!({"call": self.json(2)}) },
                _ => Part::ServerToolResponse { server_tool_response: json!({"response": self.json(2)}) },
            }
        }
        fn content(&mut self) -> Option<Content> {
            self.coin().then(|| Content { role: self.text(), parts: (0..self.below(4)).map(|_| self.part()).collect() })
        }
        fn state(&mut self) -> HashMap<String, Value> {
            let prefixes = ["", "app:", "user:", "temp:"];
            (0..self.below(4))
                .map(|i| (format!("{}k{i}{}", prefixes[self.below(4) as usize], self.text()), self.json(2)))
                .collect()
        }

        fn event(&mut self) -> adk_core::Event {
            let mut e = adk_core::Event::with_id(format!("e{}", self.next()), self.text());
            e.timestamp = Utc.timestamp_nanos((self.next() >> 2) as i64);
            e.author = self.text();
            e.branch = if self.coin() { String::new() } else { self.text() };
            let r = &mut e.llm_response;
            r.content = self.content();
            r.usage_metadata = self.coin().then(|| UsageMetadata {
                prompt_token_count: self.next() as i32,
                candidates_token_count: self.next() as i32,
                total_token_count: self.next() as i32,
                cache_read_input_token_count: self.coin().then(|| self.next() as i32),
                cost: self.coin().then(|| self.next() as f64 / 1.0e9),
                provider_usage: self.coin().then(|| json!([self.json(2)])),
                ..UsageMetadata::default()
            });
            r.finish_reason = self.coin().then(|| {
                [FinishReason::Stop, FinishReason::MaxTokens, FinishReason::Safety, FinishReason::Other]
                    [self.below(4) as usize]
            });
            r.citation_metadata = self.coin().then(|| CitationMetadata {
                citation_sources: vec![CitationSource {
                    uri: self.maybe_text(),
                    title: self.maybe_text(),
                    start_index: Some(1),
                    end_index: None,
                    license: self.maybe_text(),
                    publication_date: None,
                }],
            });
            r.partial = self.coin();
            r.turn_complete = self.coin();
            r.interrupted = self.coin();
            r.error_code = self.maybe_text();
            r.error_message = self.maybe_text();
            // JSON null would read back as `None`, in adk's own serde too.
            r.provider_metadata = self.coin().then(|| json!({"m": self.json(2)}));
            r.interaction_id = self.maybe_text();
            let a = &mut e.actions;
            a.state_delta = self.state();
            a.artifact_delta = (0..self.below(3)).map(|_| (self.text(), self.next() as i64)).collect();
            a.skip_summarization = self.coin();
            a.transfer_to_agent = self.maybe_text();
            a.escalate = self.coin();
            a.tool_confirmation = self.coin().then(|| ToolConfirmationRequest {
                tool_name: self.text(),
                function_call_id: self.maybe_text(),
                args: self.json(2),
            });
            a.tool_confirmation_decision = self
                .coin()
                .then(|| if self.coin() { ToolConfirmationDecision::Approve } else { ToolConfirmationDecision::Deny });
            a.compaction = self.coin().then(|| EventCompaction {
                start_timestamp: Utc.timestamp_nanos((self.next() >> 2) as i64),
                end_timestamp: Utc.timestamp_nanos((self.next() >> 2) as i64),
                compacted_content: Content { role: "model".into(), parts: vec![self.part()] },
            });
            a.route = self.coin().then(|| self.strings());
            e.long_running_tool_ids = self.strings();
            e.llm_request = self.maybe_text();
            e.provider_metadata = (0..self.below(3)).map(|_| (self.text(), self.text())).collect();
            e
        }
    }

    #[test]
    fn every_field_round_trips_through_the_stored_json() {
        for original in [rich_event(), adk_core::Event::with_id("e-2", "")] {
            let stored = to_store_event(&original).unwrap();
            let back = from_store_event(&through_json(&stored)).unwrap();
            assert_eq!(adk_json(&back), adk_json(&original));
            assert_eq!(back.timestamp, original.timestamp);
        }
    }

    #[test]
    fn random_events_round_trip_exactly_and_store_as_before() {
        let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
        for _ in 0..2_000 {
            let original = rng.event();
            let stored = to_store_event(&original).unwrap();
            assert_eq!(stored, reference::to_store_event(&original).unwrap(), "{original:?}");
            let read = through_json(&stored);
            let back = from_store_event(&read).unwrap();
            assert_eq!(adk_json(&back), adk_json(&original), "{original:?}");
            assert_eq!(back.timestamp, original.timestamp);
            assert_eq!(
                back.actions.compaction.as_ref().map(|c| c.start_timestamp),
                original.actions.compaction.as_ref().map(|c| c.start_timestamp)
            );
            assert_eq!(adk_json(&back), adk_json(&reference::from_store_event(&read).unwrap()));

            // Read directly from the stored form, then stored again, it is
            // byte for byte what was stored.
            let compact = serde_json::to_vec(&stored).unwrap();
            let direct = crate::event_json::direct(&compact).unwrap();
            assert_eq!(adk_json(&direct), adk_json(&original), "{original:?}");
            assert_eq!(direct.timestamp, original.timestamp);
            assert_eq!(serde_json::to_vec(&to_store_event(&direct).unwrap()).unwrap(), compact);
            // From PostgreSQL's text of the jsonb, it reads what the store
            // event path reads, byte for byte.
            let direct = read_directly(&stored).unwrap();
            let through_store = from_store_event(&serde_json::from_slice(&as_jsonb_text(&stored)).unwrap()).unwrap();
            assert_eq!(
                serde_json::to_vec(&to_store_event(&direct).unwrap()).unwrap(),
                serde_json::to_vec(&to_store_event(&through_store).unwrap()).unwrap()
            );
        }
    }

    #[test]
    fn foreign_extra_fields_read_as_before() {
        let mut rng = Rng(0x2545_F491_4F6C_DD1D);
        let keys = [
            "usage_metadata",
            "finish_reason",
            "interrupted",
            "error_code",
            "provider_metadata",
            "long_running_tool_ids",
            "event_metadata",
            "llm_request",
            "unknown",
            "id",
        ];
        let action_keys = ["route", "tool_confirmation_decision", "compaction", "state_delta", "other"];
        let (mut ok, mut refused) = (0, 0);
        for _ in 0..2_000 {
            let mut event = Event::new(rng.text());
            for _ in 0..rng.below(3) {
                event.extra.insert(keys[rng.below(keys.len() as u64) as usize].into(), rng.json(2));
            }
            for _ in 0..rng.below(2) {
                event
                    .actions
                    .extra
                    .insert(action_keys[rng.below(action_keys.len() as u64) as usize].into(), rng.json(2));
            }
            match (from_store_event(&event), reference::from_store_event(&event)) {
                (Ok(new), Ok(old)) => {
                    assert_eq!(adk_json(&new), adk_json(&old), "{event:?}");
                    ok += 1;
                }
                (Err(new), Err(_)) => {
                    assert_eq!(new.code, codes::CORRUPT_EVENT);
                    refused += 1;
                }
                (new, old) => {
                    panic!("{event:?}: {:?} but before {:?}", new.map(|e| adk_json(&e)), old.map(|e| adk_json(&e)))
                }
            }
        }
        assert!(ok > 100 && refused > 100, "{ok} read, {refused} refused");
    }

    #[test]
    fn foreign_fields_read_directly_as_through_the_store_event() {
        let mut rng = Rng(0x2545_F491_4F6C_DD1D);
        let keys =
            ["usage_metadata", "finish_reason", "interrupted", "error_code", "event_metadata", "unknown", "redaction"];
        let action_keys = ["route", "tool_confirmation_decision", "compaction", "other", "escalate"];
        let (mut ok, mut refused) = (0, 0);
        for _ in 0..2_000 {
            let mut event = Event::new(rng.text());
            for _ in 0..rng.below(3) {
                event.extra.insert(keys[rng.below(keys.len() as u64) as usize].into(), rng.json(2));
            }
            for _ in 0..rng.below(2) {
                let key = action_keys[rng.below(action_keys.len() as u64) as usize];
                event.actions.extra.insert(key.into(), rng.json(2));
            }
            let text = as_jsonb_text(&event);
            let through_store = serde_json::from_slice::<Event>(&text)
                .map_err(|e| corrupt("?", e))
                .and_then(|stored| from_store_event(&stored));
            match (crate::event_json::direct(&text), through_store) {
                (Ok(direct), Ok(old)) => {
                    assert_eq!(adk_json(&direct), adk_json(&old), "{event:?}");
                    ok += 1;
                }
                (Err(_), Err(_)) => {
                    let fallback = crate::event_json::adk_event_from_json(&text).unwrap_err();
                    assert_eq!(fallback.code, codes::CORRUPT_EVENT);
                    refused += 1;
                }
                (direct, old) => {
                    panic!(
                        "{event:?}: {:?} but through the store event {:?}",
                        direct.map(|e| adk_json(&e)),
                        old.map(|e| adk_json(&e))
                    )
                }
            }
        }
        assert!(ok > 100 && refused > 100, "{ok} read, {refused} refused");
    }

    #[test]
    fn typed_fields_are_typed_and_blanks_are_left_out() {
        let stored = to_store_event(&rich_event()).unwrap();
        assert_eq!(stored.timestamp.timestamp_subsec_nanos(), 123_456_789);
        assert_eq!(stored.branch.as_deref(), Some("root.assistant"));
        assert_eq!(stored.content.as_ref().unwrap()["role"], "model");
        assert_eq!(stored.actions.state_delta.keys().collect::<Vec<_>>(), ["app:n", "s", "user:name"]);
        assert_eq!(stored.actions.artifact_delta.keys().collect::<Vec<_>>(), ["b", "report.pdf"]);
        assert_eq!(stored.actions.escalate, Some(true));
        assert_eq!(stored.turn_complete, Some(true));
        assert_eq!(stored.partial, None);
        assert_eq!(stored.extra["long_running_tool_ids"], json!(["call-1", "call-2"]));
        assert_eq!(serde_json::to_string(&stored.extra["event_metadata"]).unwrap(), r#"{"a":"b","k":"v"}"#);
        assert_eq!(stored.actions.extra["route"], json!(["next"]));
        assert_eq!(stored.actions.extra["tool_confirmation_decision"], json!("deny"));

        let blank = to_store_event(&adk_core::Event::with_id("e", "i")).unwrap();
        assert!(blank.extra.is_empty(), "{:?}", blank.extra);
        assert!(blank.actions.extra.is_empty(), "{:?}", blank.actions.extra);
        assert_eq!((blank.branch, blank.content, blank.partial), (None, None, None));
    }

    #[test]
    fn a_redacted_event_reads_as_adk_content_with_its_redaction_in_the_metadata() {
        let stored = to_store_event(&rich_event()).unwrap();
        let at = Utc.timestamp_nanos(1_790_000_000_123_456_000);
        let tombstone = through_json(&stored.redacted("pii", at, Default::default()));
        let adk = from_store_event(&tombstone).unwrap();
        let content = adk.llm_response.content.as_ref().expect("content");
        assert_eq!(content.role, "model");
        assert!(matches!(content.parts.as_slice(), [Part::Text { text }] if text == "[redacted]"));
        assert_eq!(adk.provider_metadata.get(REDACTION_REASON).map(String::as_str), Some("pii"));
        assert_eq!(adk.provider_metadata.get(REDACTION_AT).map(String::as_str), Some("2026-09-21T14:13:20.123456000Z"));
        assert_eq!(adk.provider_metadata.get(REDACTION_STATE_DELTA).map(String::as_str), Some("false"));
        assert_eq!(adk.provider_metadata.len(), 3, "the original's metadata went: {:?}", adk.provider_metadata);
        assert_eq!((adk.id.as_str(), adk.timestamp), ("e-1", rich_event().timestamp));
        assert_eq!(adk.actions.state_delta.len(), rich_event().actions.state_delta.len(), "the delta stays");
        assert_eq!(adk_json(&read_directly(&tombstone).unwrap()), adk_json(&adk));
    }

    #[test]
    fn foreign_events_read_with_adk_defaults() {
        let mut foreign = Event::new("system");
        foreign.content = Some(json!({"role": "model", "parts": [{"text": "summary"}]}));
        let adk = from_store_event(&foreign).unwrap();
        assert_eq!(adk.author, "system");
        assert!(!adk.llm_response.interrupted && adk.long_running_tool_ids.is_empty());

        assert_eq!(adk_json(&read_directly(&foreign).unwrap()), adk_json(&adk));

        foreign.content = Some(json!("not content"));
        assert_eq!(from_store_event(&foreign).unwrap_err().code, codes::CORRUPT_EVENT);
        assert!(read_directly(&foreign).is_err());
    }
}
