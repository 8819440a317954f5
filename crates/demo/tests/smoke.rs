//! The demo, small: 5 users x 3 turns on a per-test database.

use adk_postgres_demo::agent::Script;
use adk_postgres_demo::run_demo;
use adk_postgres_testing::test_database;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_small_demo_stores_every_turn_and_survives_a_reopen() {
    let db = test_database().await;
    let report = run_demo(db.url(), 5, 3).await.expect("the demo runs");

    // Per session: turn 1 and 3 store the message, the answer and the
    // output_key event; turn 2 (the tool turn) also the call and the response.
    assert_eq!(Script { turns: 3 }.events_per_session(), 3 + 5 + 3);
    assert_eq!(report.sessions, 5);
    assert_eq!(report.distinct_users, 5);
    assert_eq!(report.users_with_preference, 5);
    assert_eq!(report.expected_events, 55);
    assert_eq!(report.events, 55);
    assert_eq!(report.appends.count, 55, "one timed append per stored event");
    assert_eq!(report.gets.count, 15, "one session load per turn");
    assert!(report.appends.p50_ms > 0.0 && report.appends.p50_ms <= report.appends.p99_ms, "{:?}", report.appends);

    assert!(report.persistence.passed(), "{:#?}", report.persistence.problems);
    assert_eq!(report.persistence.sessions_checked, 5);
    assert_eq!(report.persistence.events_checked, 55);
    assert!(report.passed());

    // The usage rollups count every stored event, and exactly the tokens
    // and cost the model reported: 5 users x (3 answers + 1 tool call).
    let usage = &report.usage;
    assert!(usage.rollup.advanced(), "{}", usage.rollup);
    assert_eq!(usage.model.calls, 20);
    assert!(usage.model.total_tokens() > 0 && usage.model.cost_nanos > 0, "{:?}", usage.model);
    assert!(usage.matches(55), "{:?} vs {:?}", usage.total(), usage.model);
    let kinds: Vec<&str> = usage.by_kind.series.iter().map(|s| s.group.as_str()).collect();
    for kind in ["user_message", "model_response", "tool_call", "tool_result"] {
        assert!(kinds.contains(&kind), "{kind} missing from {kinds:?}");
    }
    let agents: Vec<&str> = usage.by_agent.series.iter().map(|s| s.group.as_str()).collect();
    assert_eq!(agents, ["assistant", "user"]);
    assert_eq!(usage.total().sessions, 5);

    assert!(report.health.partitions_ahead >= 7, "{:?}", report.health);
    assert!(report.health.is_healthy(), "{:?}", report.health.alerts);
    if report.hot.settled {
        assert!(report.hot.updates >= 55, "{:?}", report.hot);
    }

    let text = report.render();
    for expected in [
        "events              55 (55 expected)",
        "persistence         OK",
        "usage analytics",
        "adk-pg status",
        "partitions ahead",
    ] {
        assert!(text.contains(expected), "{expected:?} missing from\n{text}");
    }
}

#[tokio::test]
async fn nothing_to_demo_is_an_error() {
    let db = test_database().await;
    assert!(run_demo(db.url(), 0, 3).await.is_err());
    assert!(run_demo(db.url(), 3, 0).await.is_err());
}
