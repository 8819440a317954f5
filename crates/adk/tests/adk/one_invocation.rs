//! One invocation at a time per session, through real `Runner`s: a second
//! runner on a busy session gets `session.busy` and stores nothing; a runner
//! that dies mid-turn holds the session only until its lease lapses; and a
//! runner whose lease was taken over cannot append any more.
#![cfg(feature = "postgres")]

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use adk_agent::LlmAgentBuilder;
use adk_core::{Agent, Content, Event, Tool, ToolContext};
use adk_postgres_adk::{PgSessionService, ScriptedLlm, ScriptedTurn, codes};
use adk_postgres_testing::test_database;
use adk_runner::Runner;
use adk_session::{CreateRequest, GetRequest, SessionService};
use async_trait::async_trait;
use futures_util::StreamExt;
use serde_json::{Value, json};
use tokio::sync::{Notify, mpsc};

const APP: &str = "one-invocation";
const USER: &str = "u-1";

/// A tool that holds its turn open until the test lets it finish: the
/// runner has stored the user's message and the tool call by then, and
/// holds the session's lease.
#[derive(Debug)]
struct Gate {
    entered: mpsc::UnboundedSender<()>,
    open: Arc<Notify>,
}

#[async_trait]
impl Tool for Gate {
    fn name(&self) -> &str {
        "wait"
    }

    fn description(&self) -> &str {
        "Waits for the test."
    }

    fn parameters_schema(&self) -> Option<Value> {
        Some(json!({"type": "object", "properties": {}}))
    }

    async fn execute(&self, _ctx: Arc<dyn ToolContext>, _args: Value) -> adk_core::Result<Value> {
        let _ = self.entered.send(());
        self.open.notified().await;
        Ok(json!({ "waited": true }))
    }
}

/// `wait` calls the gate tool, then answers `done`; anything else is
/// answered at once.
fn runner(service: &PgSessionService, gate: Gate) -> Runner {
    let model = ScriptedLlm::new("scripted", |req| {
        if ScriptedLlm::pending_tool_response(req, "wait").is_some() {
            return ScriptedTurn::Text("done".into());
        }
        match ScriptedLlm::last_user_text(req).unwrap_or_default().as_str() {
            "wait" => ScriptedTurn::CallTool { name: "wait".into(), args: json!({}) },
            other => ScriptedTurn::Text(format!("re: {other}")),
        }
    });
    let agent: Arc<dyn Agent> = Arc::new(
        LlmAgentBuilder::new("assistant")
            .instruction("Answer briefly.")
            .model(Arc::new(model))
            .tool(Arc::new(gate))
            .build()
            .expect("build the agent"),
    );
    Runner::builder()
        .app_name(APP)
        .agent(agent)
        .session_service(Arc::new(service.clone()))
        .build()
        .expect("build the runner")
}

fn gate() -> (Gate, mpsc::UnboundedReceiver<()>, Arc<Notify>) {
    let (entered, entered_rx) = mpsc::unbounded_channel();
    let open = Arc::new(Notify::new());
    (Gate { entered, open: open.clone() }, entered_rx, open)
}

/// Runs a turn to its end: the events streamed, or the first error.
async fn turn(runner: &Runner, session: &str, text: &str) -> Result<Vec<Event>, adk_core::AdkError> {
    let mut stream = runner.run_str(USER, session, Content::new("user").with_text(text)).await?;
    let mut events = Vec::new();
    while let Some(event) = stream.next().await {
        events.push(event?);
    }
    Ok(events)
}

async fn session(service: &PgSessionService) -> String {
    let request = CreateRequest { app_name: APP.into(), user_id: USER.into(), session_id: None, state: HashMap::new() };
    service.create(request).await.expect("create").id().to_owned()
}

/// The stored events' invocation ids, in order.
async fn stored_invocations(service: &PgSessionService, session: &str) -> Vec<String> {
    let request = GetRequest {
        app_name: APP.into(),
        user_id: USER.into(),
        session_id: session.into(),
        num_recent_events: None,
        after: None,
    };
    let loaded = service.get(request).await.expect("get");
    loaded.events().all().into_iter().map(|e| e.invocation_id).collect()
}

/// Each invocation's events stand together: once another invocation's
/// event came, an earlier invocation never appears again.
fn never_interleaved(invocations: &[String]) -> bool {
    let mut finished: Vec<&str> = Vec::new();
    let mut current: Option<&str> = None;
    for invocation in invocations {
        if current != Some(invocation.as_str()) {
            if finished.contains(&invocation.as_str()) {
                return false;
            }
            finished.extend(current);
            current = Some(invocation);
        }
    }
    true
}

fn busy(error: &adk_core::AdkError) -> bool {
    error.code == codes::BUSY && error.is_retryable()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_second_runner_on_a_busy_session_is_refused_and_never_interleaves() {
    let db = test_database().await;
    let service = PgSessionService::connect(db.url()).await.expect("connect");
    let id = session(&service).await;
    let (gate_a, mut entered, open) = gate();
    let first = Arc::new(runner(&service, gate_a));
    let (gate_b, _, _) = gate();
    let second = runner(&service, gate_b);

    let running = tokio::spawn({
        let (first, id) = (first.clone(), id.clone());
        async move { turn(&first, &id, "wait").await }
    });
    entered.recv().await.expect("the first turn reached its tool");
    let before = stored_invocations(&service, &id).await;
    assert_eq!(before.len(), 2, "the user's message and the tool call: {before:?}");

    let refused = turn(&second, &id, "hello").await.expect_err("the session is busy");
    assert!(busy(&refused), "{refused:?}");
    assert_eq!(refused.details.metadata["holder"], json!(before[0]), "{refused:?}");
    assert!(refused.retry.retry_after_ms.is_some_and(|ms| ms <= 1000), "{:?}", refused.retry);
    assert_eq!(stored_invocations(&service, &id).await, before, "the refused turn stored something");

    open.notify_one();
    let events = running.await.expect("join").expect("the first turn completes");
    assert!(events.iter().any(|e| e.author == "assistant" && e.is_final_response()));

    // The first turn's final answer released the session.
    turn(&second, &id, "hello").await.expect("the second turn runs once the first ended");
    let stored = stored_invocations(&service, &id).await;
    assert!(never_interleaved(&stored), "{stored:?}");
    assert_eq!(stored.iter().collect::<std::collections::BTreeSet<_>>().len(), 2, "{stored:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_killed_runner_holds_the_session_only_until_its_lease_lapses_and_cannot_append_after() {
    const IDLE: Duration = Duration::from_millis(1500);
    let db = test_database().await;
    let service = PgSessionService::connect(db.url()).await.expect("connect").with_invocation_lease(Some(IDLE));
    let id = session(&service).await;
    let (gate_a, mut entered, open) = gate();
    let stuck = Arc::new(runner(&service, gate_a));
    let (gate_b, _, _) = gate();
    let next = runner(&service, gate_b);

    // A runner stops mid-turn, as a process that died would: its tool never
    // returns while the lease is live.
    let running = tokio::spawn({
        let (stuck, id) = (stuck.clone(), id.clone());
        async move { turn(&stuck, &id, "wait").await }
    });
    entered.recv().await.expect("the first turn reached its tool");
    let refused = turn(&next, &id, "are you there").await.expect_err("held by the stuck turn");
    assert!(busy(&refused), "{refused:?}");

    tokio::time::sleep(IDLE + Duration::from_millis(300)).await;
    turn(&next, &id, "are you there").await.expect("the lease lapsed: the next turn proceeds");
    let after_takeover = stored_invocations(&service, &id).await;

    // The stuck turn wakes up late: its tool's answer is refused, not stored
    // after the other turn's events.
    open.notify_one();
    let late = running.await.expect("join").expect_err("the late holder was taken over");
    assert_eq!(late.code, codes::LEASE_LOST, "{late:?}");
    assert!(!late.is_retryable());
    let stored = stored_invocations(&service, &id).await;
    assert_eq!(stored, after_takeover, "the late holder stored an event after the takeover");
    assert!(never_interleaved(&stored), "{stored:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn with_the_lease_off_two_runners_interleave_as_adk_services_do() {
    let db = test_database().await;
    let service = PgSessionService::connect(db.url()).await.expect("connect").with_invocation_lease(None);
    let id = session(&service).await;
    let (gate_a, mut entered, open) = gate();
    let first = Arc::new(runner(&service, gate_a));
    let (gate_b, _, _) = gate();
    let second = runner(&service, gate_b);

    let running = tokio::spawn({
        let (first, id) = (first.clone(), id.clone());
        async move { turn(&first, &id, "wait").await }
    });
    entered.recv().await.expect("the first turn reached its tool");
    turn(&second, &id, "hello").await.expect("no lease: the second turn runs");
    open.notify_one();
    running.await.expect("join").expect("the first turn completes");
    let stored = stored_invocations(&service, &id).await;
    assert!(!never_interleaved(&stored), "the switch did not turn the lease off: {stored:?}");
}
