//! The agent the simulated users talk to, and what they say.
//!
//! A real adk-agent `LlmAgent` on adk-postgres-adk's offline `ScriptedLlm`:
//! one tool (`remember`) that writes `user:preference` through its actions,
//! and an `output_key` that puts every final answer into `user:last_reply`.
//! Answers are a function of the history the runner loaded from the store
//! (`turn N: …` counts the earlier answers), so a wrong or missing history
//! shows up as a wrong answer.

use std::sync::Arc;

use adk_agent::LlmAgentBuilder;
use adk_core::{Agent, Tool, ToolContext};
use adk_postgres_adk::{ScriptedLlm, ScriptedTurn};
use async_trait::async_trait;
use serde_json::{Value, json};

/// The agent's name: the author of its events.
pub const AGENT_NAME: &str = "assistant";
/// Written by the `remember` tool.
pub const PREFERENCE_KEY: &str = "user:preference";
/// Written by the agent's `output_key` at the end of every turn.
pub const LAST_REPLY_KEY: &str = "user:last_reply";

const TOOL: &str = "remember";
const PREFERENCES: [&str; 5] =
    ["green tea", "a window seat", "email over phone", "metric units", "replies in the morning"];

/// Writes `user:preference` through the tool's actions, so the write reaches
/// the store as the `user:` part of an event's state delta.
#[derive(Debug)]
struct Remember;

#[async_trait]
impl Tool for Remember {
    fn name(&self) -> &str {
        TOOL
    }

    fn description(&self) -> &str {
        "Remembers the user's preference."
    }

    fn parameters_schema(&self) -> Option<Value> {
        Some(json!({"type": "object", "properties": {"fact": {"type": "string"}}, "required": ["fact"]}))
    }

    async fn execute(&self, ctx: Arc<dyn ToolContext>, args: Value) -> adk_core::Result<Value> {
        let mut actions = ctx.actions();
        actions.state_delta.insert(PREFERENCE_KEY.to_owned(), args["fact"].clone());
        ctx.set_actions(actions);
        Ok(json!({ "stored": args["fact"] }))
    }
}

/// `remember <fact>` calls the tool, then confirms with `noted: <fact>`;
/// anything else is answered with `turn N: <text>`.
fn model() -> ScriptedLlm {
    ScriptedLlm::new("scripted", |req| {
        if let Some(response) = ScriptedLlm::pending_tool_response(req, TOOL) {
            return ScriptedTurn::Text(format!("noted: {}", response["stored"].as_str().unwrap_or("?")));
        }
        let text = ScriptedLlm::last_user_text(req).unwrap_or_default();
        match text.strip_prefix("remember ") {
            Some(fact) => ScriptedTurn::CallTool { name: TOOL.into(), args: json!({ "fact": fact }) },
            None => ScriptedTurn::Text(format!("turn {}: {text}", ScriptedLlm::turn_number(req))),
        }
    })
}

/// The agent: scripted model, the `remember` tool, `output_key`
/// `user:last_reply`.
pub fn agent() -> adk_core::Result<Arc<dyn Agent>> {
    let agent = LlmAgentBuilder::new(AGENT_NAME)
        .description("answers support questions and remembers preferences")
        .instruction("Answer briefly.")
        .model(Arc::new(model()))
        .tool(Arc::new(Remember))
        .output_key(LAST_REPLY_KEY)
        .build()?;
    Ok(Arc::new(agent))
}

/// What user `user` (0-based) says in each of `turns` turns, and what the
/// agent must answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Script {
    pub turns: usize,
}

impl Script {
    /// The turn (1-based) in which the user asks the agent to remember
    /// something: the second, or the only one.
    pub fn tool_turn(&self) -> usize {
        if self.turns >= 2 { 2 } else { 1 }
    }

    /// The preference user `user` states.
    pub fn preference(user: usize) -> &'static str {
        PREFERENCES[user % PREFERENCES.len()]
    }

    /// The user's message in `turn` (1-based).
    pub fn message(&self, user: usize, turn: usize) -> String {
        if turn == self.tool_turn() {
            format!("remember {}", Self::preference(user))
        } else if turn == 1 {
            format!("hello, this is user {user}")
        } else {
            format!("question {turn}: where is order {user}-{turn}?")
        }
    }

    /// The agent's final answer to that message.
    pub fn reply(&self, user: usize, turn: usize) -> String {
        if turn == self.tool_turn() {
            format!("noted: {}", Self::preference(user))
        } else {
            format!("turn {turn}: {}", self.message(user, turn))
        }
    }

    /// Events one turn stores: the user's message, the answer and the
    /// `output_key` event (adk-agent writes `user:last_reply` in an event of
    /// its own), plus the tool call and the tool's response in the tool turn.
    /// (The tool turn also streams a partial event; partial events are not
    /// stored.)
    pub fn events_in_turn(&self, turn: usize) -> usize {
        if turn == self.tool_turn() { 5 } else { 3 }
    }

    /// Events one conversation stores.
    pub fn events_per_session(&self) -> usize {
        (1..=self.turns).map(|turn| self.events_in_turn(turn)).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_turn_in_each_conversation_calls_the_tool() {
        let four = Script { turns: 4 };
        assert_eq!(four.tool_turn(), 2);
        assert_eq!(four.events_per_session(), 14);
        assert_eq!(four.message(3, 2), "remember metric units");
        assert_eq!(four.reply(3, 2), "noted: metric units");
        assert_eq!(four.reply(3, 1), "turn 1: hello, this is user 3");
        let one = Script { turns: 1 };
        assert_eq!(one.tool_turn(), 1);
        assert_eq!(one.events_per_session(), 5);
    }
}
