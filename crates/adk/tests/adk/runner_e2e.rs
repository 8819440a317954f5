//! A real agent, end to end and offline: adk-runner's `Runner` with an
//! adk-agent `LlmAgent` on a scripted model and a tool, keeping its
//! conversations in PostgreSQL through `PgSessionService`.
#![cfg(feature = "postgres")]

use std::collections::HashMap;
use std::sync::Arc;

use adk_agent::LlmAgentBuilder;
use adk_core::{Agent, Content, Event, Tool, ToolContext};
use adk_postgres_adk::{PgSessionService, ScriptedLlm, ScriptedTurn};
use adk_postgres_testing::test_database;
use adk_runner::Runner;
use adk_session::{CreateRequest, GetRequest, SessionService};
use async_trait::async_trait;
use futures_util::StreamExt;
use serde_json::{Value, json};

const APP: &str = "support";

/// Writes `user:fact_<session>` through the tool's actions, so the write
/// reaches the store as the `user:` part of an event's state delta.
#[derive(Debug)]
struct Remember;

#[async_trait]
impl Tool for Remember {
    fn name(&self) -> &str {
        "remember"
    }

    fn description(&self) -> &str {
        "Remembers a fact about the user."
    }

    fn parameters_schema(&self) -> Option<Value> {
        Some(json!({"type": "object", "properties": {"fact": {"type": "string"}}, "required": ["fact"]}))
    }

    async fn execute(&self, ctx: Arc<dyn ToolContext>, args: Value) -> adk_core::Result<Value> {
        let key = format!("user:fact_{}", ctx.session_id());
        let mut actions = ctx.actions();
        actions.state_delta.insert(key.clone(), args["fact"].clone());
        ctx.set_actions(actions);
        Ok(json!({ "stored": key }))
    }
}

/// `remember <fact>` calls the tool, then confirms; anything else is
/// answered with `turn N: <text>`, N counting the answers in the history the
/// runner loaded, so a reply proves which history the model saw.
fn model() -> ScriptedLlm {
    ScriptedLlm::new("scripted", |req| {
        if let Some(response) = ScriptedLlm::pending_tool_response(req, "remember") {
            return ScriptedTurn::Text(format!("noted as {}", response["stored"].as_str().unwrap_or("?")));
        }
        let text = ScriptedLlm::last_user_text(req).unwrap_or_default();
        match text.strip_prefix("remember ") {
            Some(fact) => ScriptedTurn::CallTool { name: "remember".into(), args: json!({ "fact": fact }) },
            None => ScriptedTurn::Text(format!("turn {}: {text}", ScriptedLlm::turn_number(req))),
        }
    })
}

fn agent() -> Arc<dyn Agent> {
    let agent = LlmAgentBuilder::new("assistant")
        .description("answers support questions")
        .instruction("Answer briefly.")
        .model(Arc::new(model()))
        .tool(Arc::new(Remember))
        // The final answer of every turn lands in user-scoped state.
        .output_key("user:last_reply")
        .build()
        .expect("build the agent");
    Arc::new(agent)
}

fn runner(service: &PgSessionService) -> Runner {
    Runner::builder()
        .app_name(APP)
        .agent(agent())
        .session_service(Arc::new(service.clone()))
        .build()
        .expect("build the runner")
}

/// Runs one turn; returns the events the runner streamed.
async fn turn(runner: &Runner, user: &str, session: &str, text: &str) -> Vec<Event> {
    let mut stream = runner.run_str(user, session, Content::new("user").with_text(text)).await.expect("start the turn");
    let mut events = Vec::new();
    while let Some(event) = stream.next().await {
        events.push(event.unwrap_or_else(|e| panic!("turn {text:?} on {session}: {e}")));
    }
    events
}

/// The final text answer of a turn.
fn reply(events: &[Event]) -> String {
    events
        .iter()
        .rev()
        .filter(|e| e.author == "assistant")
        .find_map(|e| e.content().and_then(|c| c.parts.iter().find_map(|p| p.text().map(str::to_owned))))
        .unwrap_or_default()
}

async fn create(service: &PgSessionService, user: &str, id: Option<&str>) -> String {
    let request = CreateRequest {
        app_name: APP.into(),
        user_id: user.into(),
        session_id: id.map(Into::into),
        state: HashMap::new(),
    };
    service.create(request).await.expect("create session").id().to_owned()
}

async fn load(service: &PgSessionService, user: &str, id: &str) -> Box<dyn adk_session::Session> {
    let request = GetRequest {
        app_name: APP.into(),
        user_id: user.into(),
        session_id: id.into(),
        num_recent_events: None,
        after: None,
    };
    service.get(request).await.expect("load session")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_conversation_survives_a_new_store_instance() {
    let db = test_database().await;
    let user = "u-42";

    // First process: its own pool.
    let first = PgSessionService::connect(db.url()).await.expect("connect");
    let session = create(&first, user, Some("conv-1")).await;
    let runner1 = runner(&first);
    assert_eq!(reply(&turn(&runner1, user, &session, "hello").await), "turn 1: hello");
    let tool_turn = turn(&runner1, user, &session, "remember likes tea").await;
    assert!(tool_turn.iter().any(|e| !e.tool_calls().is_empty()), "the model called no tool");
    assert_eq!(reply(&tool_turn), "noted as user:fact_conv-1");
    assert_eq!(reply(&turn(&runner1, user, &session, "how are you").await), "turn 3: how are you");

    let before = load(&first, user, &session).await;
    let streamed_ids: Vec<String> = before.events().all().into_iter().map(|e| e.id).collect();
    assert!(streamed_ids.len() >= 9, "3 turns stored only {} events", streamed_ids.len());
    let state = before.state().all();
    assert_eq!(state.get("user:last_reply"), Some(&json!("turn 3: how are you")), "{state:?}");
    assert_eq!(state.get("user:fact_conv-1"), Some(&json!("likes tea")), "{state:?}");
    drop((runner1, first));

    // Second process: a new store instance on a new pool, same database.
    let second = PgSessionService::connect(db.url()).await.expect("reconnect");
    let reloaded = load(&second, user, &session).await;
    let reloaded_ids: Vec<String> = reloaded.events().all().into_iter().map(|e| e.id).collect();
    assert_eq!(reloaded_ids, streamed_ids, "history differs after reconnecting");
    for (a, b) in before.events().all().iter().zip(reloaded.events().all().iter()) {
        assert_eq!(serde_json::to_value(a).unwrap(), serde_json::to_value(b).unwrap(), "event {} changed", a.id);
    }
    assert_eq!(reloaded.state().all(), before.state().all());

    // The conversation continues where it stopped: the model is sent all
    // three earlier user messages.
    let runner2 = runner(&second);
    assert_eq!(reply(&turn(&runner2, user, &session, "and now?").await), "turn 4: and now?");
    let after = load(&second, user, &session).await;
    assert_eq!(after.state().get("user:last_reply"), Some(json!("turn 4: and now?")));
    assert!(after.events().len() > reloaded_ids.len());

    // User-scoped state follows the user into a new session.
    let fresh = create(&second, user, None).await;
    let fresh = load(&second, user, &fresh).await;
    assert_eq!(fresh.state().get("user:fact_conv-1"), Some(json!("likes tea")));
    assert!(fresh.events().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 8)]
async fn concurrent_runs_of_one_user_lose_no_user_state() {
    const SESSIONS: usize = 12;
    let db = test_database().await;
    let service = PgSessionService::connect(db.url()).await.expect("connect");
    let runner = Arc::new(runner(&service));
    let user = "u-busy";
    let mut sessions = Vec::new();
    for _ in 0..SESSIONS {
        sessions.push(create(&service, user, None).await);
    }

    let barrier = Arc::new(tokio::sync::Barrier::new(SESSIONS));
    let mut runs = tokio::task::JoinSet::new();
    for (i, session) in sessions.iter().cloned().enumerate() {
        let (runner, barrier) = (runner.clone(), barrier.clone());
        runs.spawn(async move {
            barrier.wait().await;
            let events = turn(&runner, user, &session, &format!("remember fact {i}")).await;
            (session, reply(&events))
        });
    }
    while let Some(done) = runs.join_next().await {
        let (session, answer) = done.expect("a run panicked");
        assert_eq!(answer, format!("noted as user:fact_{session}"));
    }

    let state = load(&service, user, &sessions[0]).await.state().all();
    let missing: Vec<&String> = sessions.iter().filter(|s| !state.contains_key(&format!("user:fact_{s}"))).collect();
    assert!(missing.is_empty(), "user state lost the writes of {missing:?}: {state:?}");
    let last_reply = state.get("user:last_reply").and_then(Value::as_str).unwrap_or_default();
    assert!(last_reply.starts_with("noted as user:fact_"), "{last_reply:?}");
}

#[tokio::test]
async fn adk_models_mock_llm_runs_on_the_store() {
    let db = test_database().await;
    let service = PgSessionService::connect(db.url()).await.expect("connect");
    let mock = adk_model::MockLlm::new("mock")
        .with_response(adk_core::LlmResponse::new(Content::new("model").with_text("hello from the mock")));
    let agent = LlmAgentBuilder::new("assistant").model(Arc::new(mock)).output_key("greeting").build().expect("agent");
    let runner = Runner::builder()
        .app_name(APP)
        .agent(Arc::new(agent))
        .session_service(Arc::new(service.clone()))
        .build()
        .expect("runner");
    let session = create(&service, "u-mock", None).await;
    let events = turn(&runner, "u-mock", &session, "hi").await;
    assert_eq!(reply(&events), "hello from the mock");
    let stored = load(&service, "u-mock", &session).await;
    assert_eq!(stored.state().get("greeting"), Some(json!("hello from the mock")));
    assert_eq!(stored.events().at(0).map(|e| e.author.as_str()), Some("user"));
}
