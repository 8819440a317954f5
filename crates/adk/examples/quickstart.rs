//! The README's "Use with adk-rust" path, runnable: migrate, connect, run one
//! turn of an agent through adk-runner's `Runner`, then read the
//! conversation back, list it and rewind it.
//!
//! ```sh
//! DATABASE_URL=postgres://localhost/agents cargo run -p adk-postgres-adk --example quickstart
//! ```
//!
//! The part between `// README: begin` and `// README: end` is the README's
//! snippet, character for character; `crates/adk/tests/adk/readme_path.rs` fails
//! when the two drift apart, and runs [`run`] on a fresh, empty database.
//! `main` uses an offline scripted model, so no API key or network is needed.

// README: begin
use std::sync::Arc;

use adk_core::{Agent, Content, Event};
use adk_postgres_adk::PgSessionService;
use adk_runner::Runner;
use adk_session::{CreateRequest, GetRequest, ListRequest, SessionService};
use futures_util::StreamExt;

/// What one conversation left in PostgreSQL.
#[derive(Debug)]
pub struct Conversation {
    pub session_id: String,
    /// The events the runner streamed; each was stored before it was yielded.
    pub streamed: Vec<Event>,
    /// The session's events read back with `get`: the user's message too.
    pub stored: Vec<Event>,
    /// The user's sessions from `list`, newest first.
    pub listed: Vec<String>,
    /// The events left after rewinding the last one.
    pub rewound: Vec<Event>,
}

pub async fn run(url: &str, agent: Arc<dyn Agent>) -> adk_core::Result<Conversation> {
    adk_postgres_adk::migrate(url).await?; // once, at deploy or start-up
    let sessions = Arc::new(PgSessionService::connect(url).await?);
    let runner = Runner::builder().app_name("support").agent(agent).session_service(sessions.clone()).build()?;

    let request = CreateRequest {
        app_name: "support".into(),
        user_id: "u-42".into(),
        session_id: None,
        state: Default::default(),
    };
    let session = sessions.create(request).await?;
    let message = Content::new("user").with_text("Where is my order?");
    let mut stream = runner.run_str("u-42", session.id(), message).await?;
    let mut streamed = Vec::new();
    while let Some(event) = stream.next().await {
        streamed.push(event?);
    }

    let request = GetRequest {
        app_name: "support".into(),
        user_id: "u-42".into(),
        session_id: session.id().into(),
        num_recent_events: None,
        after: None,
    };
    let stored = sessions.get(request).await?.events().all();
    let request = ListRequest { app_name: "support".into(), user_id: "u-42".into(), limit: None, offset: None };
    let listed = sessions.list(request).await?.iter().map(|s| s.id().to_owned()).collect();
    // Drops the agent's answer, e.g. to have it generated again.
    let rewound = sessions.rewind_steps(session.id(), 1).await?.events().all();
    Ok(Conversation { session_id: session.id().into(), streamed, stored, listed, rewound })
}
// README: end

/// An agent on [`adk_postgres_adk::ScriptedLlm`], which answers
/// `turn N: <message>` without a network, so the example and its test run
/// anywhere a PostgreSQL does.
pub fn offline_agent() -> adk_core::Result<Arc<dyn Agent>> {
    let model = adk_postgres_adk::ScriptedLlm::echo("scripted");
    let agent = adk_agent::LlmAgentBuilder::new("assistant")
        .description("answers support questions")
        .instruction("Answer briefly.")
        .model(Arc::new(model))
        .build()?;
    Ok(Arc::new(agent))
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let url = std::env::var("DATABASE_URL")
        .map_err(|_| "set DATABASE_URL, e.g. postgres://localhost/agents (the example migrates it)")?;
    let conversation = run(&url, offline_agent()?).await?;
    println!("session {}", conversation.session_id);
    for event in &conversation.stored {
        let text: String = event.content().iter().flat_map(|c| c.parts.iter()).filter_map(|p| p.text()).collect();
        println!("  {:<10} {text}", event.author);
    }
    println!(
        "{} events stored, {} session(s) listed for u-42, {} event(s) left after rewinding one",
        conversation.stored.len(),
        conversation.listed.len(),
        conversation.rewound.len()
    );
    Ok(())
}
