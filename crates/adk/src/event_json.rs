//! A stored event's JSON read straight into adk's `Event`, for a get: one
//! parse, no store `Event` and no JSON tree of the content in between.
//!
//! It reads exactly what [`crate::event::from_store_event`] reads from the
//! store event the same JSON decodes to (the tests pin that on thousands of
//! random events). When it cannot read a document it hands it to that path,
//! whose error names the event and the field: the two can differ only in
//! how they fail, never in what they return.

use std::collections::HashMap;
use std::fmt;

use adk_core::{AdkError, Content, LlmResponse, Part};
use adk_postgres_domain::Redaction;
use chrono::{DateTime, Utc};
use serde::Deserialize;
use serde::de::{self, Deserializer, IgnoredAny, MapAccess, Visitor};
use serde_json::{Map, Value};

use crate::event::{corrupt, into_adk_event, show_redaction, to_part};

/// The adk event stored as `json` (a store `Event`'s serde form).
pub(crate) fn adk_event_from_json(json: &[u8]) -> Result<adk_core::Event, AdkError> {
    match serde_json::from_slice::<Direct>(json) {
        Ok(Direct(event)) => Ok(event),
        Err(_) => {
            let event = serde_json::from_slice(json).map_err(|e| corrupt("(unreadable)", e))?;
            into_adk_event(event)
        }
    }
}

/// The direct reading alone, for the tests that pin it to the other path.
#[cfg(test)]
pub(crate) fn direct(json: &[u8]) -> serde_json::Result<adk_core::Event> {
    serde_json::from_slice::<Direct>(json).map(|Direct(event)| event)
}

struct Direct(adk_core::Event);

impl<'de> Deserialize<'de> for Direct {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_map(EventVisitor)
    }
}

/// A key of a stored event, read without allocating; anything the adapter
/// does not map is `Other` and skipped, as adk's serde would.
macro_rules! keys {
    ($name:ident { $($variant:ident = $text:literal),+ $(,)? }) => {
        enum $name {
            $($variant,)+
            Other,
        }

        impl<'de> Deserialize<'de> for $name {
            fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
                struct KeyVisitor;
                impl Visitor<'_> for KeyVisitor {
                    type Value = $name;
                    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                        f.write_str("a field name")
                    }
                    fn visit_str<E: de::Error>(self, key: &str) -> Result<$name, E> {
                        Ok(match key {
                            $($text => $name::$variant,)+
                            _ => $name::Other,
                        })
                    }
                }
                deserializer.deserialize_identifier(KeyVisitor)
            }
        }
    };
}

keys!(EventKey {
    Id = "id",
    InvocationId = "invocation_id",
    Author = "author",
    Timestamp = "timestamp",
    Branch = "branch",
    Content = "content",
    Actions = "actions",
    Partial = "partial",
    TurnComplete = "turn_complete",
    Redaction = "redaction",
    UsageMetadata = "usage_metadata",
    FinishReason = "finish_reason",
    CitationMetadata = "citation_metadata",
    Interrupted = "interrupted",
    ErrorCode = "error_code",
    ErrorMessage = "error_message",
    ProviderMetadata = "provider_metadata",
    InteractionId = "interaction_id",
    LongRunningToolIds = "long_running_tool_ids",
    LlmRequest = "llm_request",
    EventMetadata = "event_metadata",
});

keys!(ActionsKey {
    StateDelta = "state_delta",
    ArtifactDelta = "artifact_delta",
    TransferToAgent = "transfer_to_agent",
    Escalate = "escalate",
    SkipSummarization = "skip_summarization",
    ToolConfirmation = "tool_confirmation",
    ToolConfirmationDecision = "tool_confirmation_decision",
    Compaction = "compaction",
    Route = "route",
});

keys!(ContentKey { Role = "role", Parts = "parts" });

struct EventVisitor;

impl<'de> Visitor<'de> for EventVisitor {
    type Value = Direct;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a stored event")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Direct, A::Error> {
        let (mut id, mut author, mut timestamp) = (None, None, None);
        let mut invocation_id = String::new();
        let mut branch = None;
        let mut llm_response = LlmResponse::default();
        let mut actions = adk_core::EventActions::default();
        let mut long_running_tool_ids = Vec::new();
        let mut llm_request = None;
        let mut event_metadata = HashMap::new();
        let mut redaction: Option<Redaction> = None;
        while let Some(key) = map.next_key::<EventKey>()? {
            match key {
                EventKey::Id => id = Some(map.next_value::<String>()?),
                EventKey::InvocationId => invocation_id = map.next_value()?,
                EventKey::Author => author = Some(map.next_value::<String>()?),
                EventKey::Timestamp => {
                    let text = map.next_value::<std::borrow::Cow<'_, str>>()?;
                    let parsed = DateTime::parse_from_rfc3339(&text).map_err(de::Error::custom)?;
                    timestamp = Some(parsed.with_timezone(&Utc));
                }
                EventKey::Branch => branch = map.next_value::<Option<String>>()?,
                EventKey::Content => llm_response.content = map.next_value::<Option<DirectContent>>()?.map(|c| c.0),
                EventKey::Actions => actions = map.next_value::<DirectActions>()?.0,
                EventKey::Partial => llm_response.partial = map.next_value::<Option<bool>>()?.unwrap_or(false),
                EventKey::TurnComplete => {
                    llm_response.turn_complete = map.next_value::<Option<bool>>()?.unwrap_or(false);
                }
                EventKey::Redaction => redaction = map.next_value()?,
                EventKey::UsageMetadata => llm_response.usage_metadata = map.next_value()?,
                EventKey::FinishReason => llm_response.finish_reason = map.next_value()?,
                EventKey::CitationMetadata => llm_response.citation_metadata = map.next_value()?,
                EventKey::Interrupted => llm_response.interrupted = map.next_value()?,
                EventKey::ErrorCode => llm_response.error_code = map.next_value()?,
                EventKey::ErrorMessage => llm_response.error_message = map.next_value()?,
                EventKey::ProviderMetadata => llm_response.provider_metadata = map.next_value()?,
                EventKey::InteractionId => llm_response.interaction_id = map.next_value()?,
                EventKey::LongRunningToolIds => long_running_tool_ids = map.next_value()?,
                EventKey::LlmRequest => llm_request = map.next_value()?,
                EventKey::EventMetadata => event_metadata = map.next_value()?,
                EventKey::Other => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        let id = id.ok_or_else(|| de::Error::missing_field("id"))?;
        let author = author.ok_or_else(|| de::Error::missing_field("author"))?;
        let timestamp = timestamp.ok_or_else(|| de::Error::missing_field("timestamp"))?;
        // After the whole object: the metadata key may come after the
        // redaction, and the redaction's keys are the last word.
        if let Some(redaction) = redaction {
            show_redaction(redaction, &mut event_metadata);
        }
        Ok(Direct(adk_core::Event {
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
        }))
    }
}

struct DirectActions(adk_core::EventActions);

impl<'de> Deserialize<'de> for DirectActions {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct ActionsVisitor;
        impl<'de> Visitor<'de> for ActionsVisitor {
            type Value = DirectActions;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("an event's actions")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<DirectActions, A::Error> {
                let mut actions = adk_core::EventActions::default();
                while let Some(key) = map.next_key::<ActionsKey>()? {
                    match key {
                        ActionsKey::StateDelta => actions.state_delta = map.next_value()?,
                        ActionsKey::ArtifactDelta => actions.artifact_delta = map.next_value()?,
                        ActionsKey::TransferToAgent => actions.transfer_to_agent = map.next_value()?,
                        ActionsKey::Escalate => actions.escalate = map.next_value::<Option<bool>>()?.unwrap_or(false),
                        ActionsKey::SkipSummarization => {
                            actions.skip_summarization = map.next_value::<Option<bool>>()?.unwrap_or(false);
                        }
                        ActionsKey::ToolConfirmation => actions.tool_confirmation = map.next_value()?,
                        ActionsKey::ToolConfirmationDecision => {
                            actions.tool_confirmation_decision = map.next_value()?
                        }
                        ActionsKey::Compaction => actions.compaction = map.next_value()?,
                        ActionsKey::Route => actions.route = map.next_value()?,
                        ActionsKey::Other => {
                            map.next_value::<IgnoredAny>()?;
                        }
                    }
                }
                Ok(DirectActions(actions))
            }
        }
        deserializer.deserialize_map(ActionsVisitor)
    }
}

/// adk `Content`, read as its serde reads it, with text parts built
/// directly: `Part` is untagged, so serde would buffer each part and try
/// `Thinking` before `Text`.
struct DirectContent(Content);

impl<'de> Deserialize<'de> for DirectContent {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct ContentVisitor;
        impl<'de> Visitor<'de> for ContentVisitor {
            type Value = DirectContent;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("adk content")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<DirectContent, A::Error> {
                let (mut role, mut parts) = (None, None);
                while let Some(key) = map.next_key::<ContentKey>()? {
                    match key {
                        ContentKey::Role => role = Some(map.next_value::<String>()?),
                        ContentKey::Parts => {
                            parts = Some(map.next_value::<Vec<DirectPart>>()?.into_iter().map(|p| p.0).collect());
                        }
                        ContentKey::Other => {
                            map.next_value::<IgnoredAny>()?;
                        }
                    }
                }
                Ok(DirectContent(Content {
                    role: role.ok_or_else(|| de::Error::missing_field("role"))?,
                    parts: parts.ok_or_else(|| de::Error::missing_field("parts"))?,
                }))
            }
        }
        deserializer.deserialize_map(ContentVisitor)
    }
}

/// One part: `{"text": "…"}` becomes `Part::Text` without a map; any other
/// part is read as a JSON value and handed to adk's serde.
struct DirectPart(Part);

impl<'de> Deserialize<'de> for DirectPart {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct PartVisitor;
        impl<'de> Visitor<'de> for PartVisitor {
            type Value = DirectPart;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("an adk content part")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<DirectPart, A::Error> {
                let mut fields = Map::new();
                while let Some(key) = map.next_key::<String>()? {
                    match map.next_value::<Value>()? {
                        Value::String(text) if fields.is_empty() && key == "text" => match map.next_key::<String>()? {
                            None => return Ok(DirectPart(Part::Text { text })),
                            Some(next) => {
                                fields.insert(key, Value::String(text));
                                let value = map.next_value::<Value>()?;
                                fields.insert(next, value);
                            }
                        },
                        value => {
                            fields.insert(key, value);
                        }
                    }
                }
                to_part(Value::Object(fields)).map(DirectPart).map_err(de::Error::custom)
            }
        }
        deserializer.deserialize_any(PartVisitor)
    }
}
