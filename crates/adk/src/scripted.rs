//! [`ScriptedLlm`]: a deterministic, offline model for tests and demos that
//! drive a real `Runner`.
//!
//! adk-model's `MockLlm` answers every request with the same queued
//! responses, which cannot express a multi-turn conversation or a tool-call
//! round trip. A scripted model decides each answer from the request alone
//! (the history the runner loaded from the session store), so it is
//! stateless: concurrent sessions, a restarted process or a new store
//! instance all see the same behaviour, and an answer can prove which
//! history the model was given.

use std::sync::Arc;

use adk_core::{Content, Llm, LlmRequest, LlmResponse, LlmResponseStream, Part};
use async_trait::async_trait;
use serde_json::Value;

/// What the model answers to one request.
#[derive(Debug, Clone, PartialEq)]
pub enum ScriptedTurn {
    /// A final text answer.
    Text(String),
    /// A call of the tool `name` with `args`; the agent runs the tool and
    /// asks the model again with the tool's response in the history.
    CallTool {
        /// The tool's name.
        name: String,
        /// Its arguments, as JSON.
        args: Value,
    },
}

type Script = dyn Fn(&LlmRequest) -> ScriptedTurn + Send + Sync;

/// A model whose answers are a function of the request.
#[derive(Clone)]
pub struct ScriptedLlm {
    name: String,
    script: Arc<Script>,
}

impl std::fmt::Debug for ScriptedLlm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ScriptedLlm").field("name", &self.name).finish_non_exhaustive()
    }
}

impl ScriptedLlm {
    /// A model answering with `script(request)`.
    pub fn new(name: impl Into<String>, script: impl Fn(&LlmRequest) -> ScriptedTurn + Send + Sync + 'static) -> Self {
        Self { name: name.into(), script: Arc::new(script) }
    }

    /// Answers `"turn N: <last user text>"` (see [`ScriptedLlm::turn_number`]),
    /// so a reply shows how much history the runner loaded.
    pub fn echo(name: impl Into<String>) -> Self {
        Self::new(name, |req| {
            ScriptedTurn::Text(format!(
                "turn {}: {}",
                Self::turn_number(req),
                Self::last_user_text(req).unwrap_or_default()
            ))
        })
    }

    /// 1 + the text answers the model gave earlier in the request's history:
    /// the number of the turn being answered, counted from what the runner
    /// loaded. (User messages cannot be counted instead: an agent's
    /// instructions also travel as user-role contents.)
    pub fn turn_number(req: &LlmRequest) -> usize {
        1 + req.contents.iter().filter(|c| c.role == "model" && c.parts.iter().any(|p| p.text().is_some())).count()
    }

    /// The text of the last user message.
    pub fn last_user_text(req: &LlmRequest) -> Option<String> {
        req.contents.iter().rev().filter(|c| c.role == "user").find_map(|c| {
            let text: String = c.parts.iter().filter_map(Part::text).collect();
            Some(text).filter(|t| !t.is_empty())
        })
    }

    /// The response of tool `name` when it is the latest content: the model
    /// is being asked to continue after calling it.
    pub fn pending_tool_response<'a>(req: &'a LlmRequest, name: &str) -> Option<&'a Value> {
        req.contents.last()?.parts.iter().find_map(|p| match p {
            Part::FunctionResponse { function_response, .. } if function_response.name == name => {
                Some(&function_response.response)
            }
            _ => None,
        })
    }
}

#[async_trait]
impl Llm for ScriptedLlm {
    fn name(&self) -> &str {
        &self.name
    }

    async fn generate_content(&self, req: LlmRequest, _stream: bool) -> adk_core::Result<LlmResponseStream> {
        let part = match (self.script)(&req) {
            ScriptedTurn::Text(text) => Part::Text { text },
            ScriptedTurn::CallTool { name, args } => Part::FunctionCall {
                id: Some(format!("call-{}", call_ordinal(&req))),
                name,
                args,
                thought_signature: None,
            },
        };
        let response = LlmResponse::new(Content { role: "model".into(), parts: vec![part] });
        Ok(Box::pin(futures_util::stream::iter([Ok(response)])))
    }
}

/// A call id unique within a session's history without a random source:
/// the number of contents so far.
fn call_ordinal(req: &LlmRequest) -> usize {
    req.contents.len()
}
