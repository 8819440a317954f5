//! The agent the simulated users talk to, and what they say.
//!
//! A real adk-agent `LlmAgent` on adk-postgres-adk's offline `ScriptedLlm`:
//! one tool (`remember`) that writes `user:preference` through its actions,
//! and an `output_key` that puts every final answer into `user:last_reply`.
//! Answers are a function of the history the runner loaded from the store
//! (`turn N: …` counts the earlier answers), so a wrong or missing history
//! shows up as a wrong answer.
//!
//! `ScriptedLlm` reports no usage, so the model is wrapped in [`Metered`],
//! which puts `usage_metadata` on every answer as a hosted model would:
//! prompt tokens for the whole request it was sent (the history, the
//! instruction and the tool's declaration), output tokens for the answer,
//! both estimated at four characters a token, and the cost at an
//! illustrative price ([`PRICE_PER_MILLION`]). The store keeps it in the
//! event, and the usage rollups count it.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use adk_agent::LlmAgentBuilder;
use adk_core::{Agent, Llm, LlmRequest, LlmResponseStream, Tool, ToolContext, UsageMetadata};
use adk_postgres_adk::{ScriptedLlm, ScriptedTurn};
use async_trait::async_trait;
use futures_util::StreamExt as _;
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

/// Illustrative prices, in US dollars per million prompt and output tokens
/// (a small hosted model's list price).
pub const PRICE_PER_MILLION: (f64, f64) = (0.30, 2.50);
/// Characters per token of the estimate.
const CHARS_PER_TOKEN: usize = 4;

/// What the model reported, summed over every answer it gave.
#[derive(Debug, Default)]
pub struct Meter {
    calls: AtomicU64,
    prompt_tokens: AtomicU64,
    candidates_tokens: AtomicU64,
    /// In billionths of a dollar, so the sum is exact.
    cost_nanos: AtomicU64,
}

/// A [`Meter`]'s totals.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MeterReading {
    pub calls: u64,
    pub prompt_tokens: u64,
    pub candidates_tokens: u64,
    pub cost_nanos: u64,
}

impl MeterReading {
    pub fn total_tokens(&self) -> u64 {
        self.prompt_tokens + self.candidates_tokens
    }

    /// The cost in dollars, as the model reported it (nine decimals).
    pub fn cost(&self) -> String {
        format!("{}.{:09}", self.cost_nanos / 1_000_000_000, self.cost_nanos % 1_000_000_000)
    }
}

impl Meter {
    pub fn read(&self) -> MeterReading {
        MeterReading {
            calls: self.calls.load(Ordering::Relaxed),
            prompt_tokens: self.prompt_tokens.load(Ordering::Relaxed),
            candidates_tokens: self.candidates_tokens.load(Ordering::Relaxed),
            cost_nanos: self.cost_nanos.load(Ordering::Relaxed),
        }
    }
}

/// The usage a hosted model would report for `prompt_chars` characters in
/// and `answer_chars` out, and its cost in billionths of a dollar.
pub fn usage(prompt_chars: usize, answer_chars: usize) -> (UsageMetadata, u64) {
    let tokens = |chars: usize| i32::try_from(chars.div_ceil(CHARS_PER_TOKEN).max(1)).unwrap_or(i32::MAX);
    let (prompt, candidates) = (tokens(prompt_chars), tokens(answer_chars));
    // Nano-dollars per token: the price per million tokens times 1,000.
    let nanos = |count: i32, per_million: f64| u64::try_from(count).unwrap_or(0) * (per_million * 1_000.0) as u64;
    let cost_nanos = nanos(prompt, PRICE_PER_MILLION.0) + nanos(candidates, PRICE_PER_MILLION.1);
    let usage = UsageMetadata {
        prompt_token_count: prompt,
        candidates_token_count: candidates,
        total_token_count: prompt.saturating_add(candidates),
        cost: Some(cost_nanos as f64 / 1e9),
        ..UsageMetadata::default()
    };
    (usage, cost_nanos)
}

/// A model that reports usage: `inner`'s answers, each with the
/// `usage_metadata` of [`usage`], added up in `meter`.
#[derive(Debug, Clone)]
pub struct Metered {
    inner: ScriptedLlm,
    meter: Arc<Meter>,
}

#[async_trait]
impl Llm for Metered {
    fn name(&self) -> &str {
        self.inner.name()
    }

    async fn generate_content(&self, req: LlmRequest, stream: bool) -> adk_core::Result<LlmResponseStream> {
        // The request as a provider would be sent it: the history, the
        // generation config and the tool declarations.
        let prompt_chars = json_chars(&req) + req.tools.values().map(json_chars).sum::<usize>();
        let meter = self.meter.clone();
        let answers = self.inner.generate_content(req, stream).await?;
        Ok(Box::pin(answers.map(move |answer| {
            let mut answer = answer?;
            if !answer.partial {
                let (usage, cost_nanos) = usage(prompt_chars, answer.content.as_ref().map_or(0, json_chars));
                meter.calls.fetch_add(1, Ordering::Relaxed);
                meter.prompt_tokens.fetch_add(u64::try_from(usage.prompt_token_count).unwrap_or(0), Ordering::Relaxed);
                meter
                    .candidates_tokens
                    .fetch_add(u64::try_from(usage.candidates_token_count).unwrap_or(0), Ordering::Relaxed);
                meter.cost_nanos.fetch_add(cost_nanos, Ordering::Relaxed);
                answer.usage_metadata = Some(usage);
            }
            Ok(answer)
        })))
    }
}

/// Characters of a value's compact JSON: what a request sends.
fn json_chars(value: &impl serde::Serialize) -> usize {
    serde_json::to_string(value).map_or(0, |text| text.chars().count())
}

/// The agent: scripted model, the `remember` tool, `output_key`
/// `user:last_reply`. Its model's usage is added up in a meter of its own.
pub fn agent() -> adk_core::Result<Arc<dyn Agent>> {
    agent_metered(Arc::new(Meter::default()))
}

/// [`agent`], its model's usage added up in `meter`.
pub fn agent_metered(meter: Arc<Meter>) -> adk_core::Result<Arc<dyn Agent>> {
    let agent = LlmAgentBuilder::new(AGENT_NAME)
        .description("answers support questions and remembers preferences")
        .instruction("Answer briefly.")
        .model(Arc::new(Metered { inner: model(), meter }))
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
