//! `rewind` and `rollover`, including their retries.

use adk_postgres_domain::{Event, StoreConfig, StoreError};
use serde_json::json;

use super::*;

pub async fn rewind_keeps_the_first_events_and_rebuilds_session_state<F: StoreFactory>(f: &F) {
    let store = f.store(StoreConfig::default()).await;
    let (app, user) = names("rewind");
    let session = create(&*store, &app, &user, "s", json!({})).await;
    let mut appended = Vec::new();
    for i in 1..=5 {
        let delta = json!({ "step": i, format!("only_{i}"): true, "user:seen": i, "temp:scratch": i });
        appended.push(append(&*store, &session.key, ev(delta)).await.event);
    }
    let rewound = store.rewind(&session.key, 2, Some(5)).await.expect("rewind");
    assert_eq!(rewound.version, 2);
    assert_eq!(ids(&rewound.events), ids(&appended[..2]));
    assert_eq!(rewound.state.get("step"), Some(&json!(2)));
    assert_eq!(rewound.state.get("only_1"), Some(&json!(true)));
    assert!(rewound.state.get("only_3").is_none(), "state of a forgotten event survived: {:?}", rewound.state);
    assert_eq!(rewound.state.get("user:seen"), Some(&json!(5)), "user state is shared and stays");
    assert!(rewound.state.keys().all(|k| !k.starts_with("temp:")));
    assert_eq!(get(&*store, &session.key).await, rewound, "the rewind is what a later read sees");

    let next = append(&*store, &session.key, ev(json!({}))).await;
    assert_eq!(next.seq, Some(3), "sequence numbers continue from the kept events");
    // A forgotten event id is free again.
    let reused = append(&*store, &session.key, appended[3].clone()).await;
    assert_eq!(reused.seq, Some(4));
    assert!(!reused.replayed);

    let emptied = store.rewind(&session.key, 0, None).await.expect("rewind to nothing");
    assert!(emptied.events.is_empty());
    assert_eq!(emptied.version, 0);
    assert!(emptied.state.keys().all(|k| k.starts_with("user:")), "{:?}", emptied.state);
}

pub async fn rewind_refuses_stale_versions_and_targets_past_the_end<F: StoreFactory>(f: &F) {
    let store = f.store(StoreConfig::default()).await;
    let (app, user) = names("rewindbad");
    let session = create(&*store, &app, &user, "s", json!({})).await;
    for i in 0..3 {
        append(&*store, &session.key, ev(json!({ "i": i }))).await;
    }
    let before = get(&*store, &session.key).await;
    let stale = store.rewind(&session.key, 1, Some(2)).await;
    assert!(matches!(stale, Err(StoreError::StaleSession { expected: 2, actual: 3, .. })), "{stale:?}");
    expect_invalid(store.rewind(&session.key, 4, None).await, |f| f == "keep", "rewind past the end");
    expect_not_found(store.rewind(&key(&app, &user, "missing"), 0, None).await, &key(&app, &user, "missing"), "rewind");
    assert_eq!(get(&*store, &session.key).await, before, "a refused rewind changed the session");
}

pub async fn rewind_starts_from_the_state_the_session_was_created_with<F: StoreFactory>(f: &F) {
    let store = f.store(StoreConfig::default()).await;
    let (app, user) = names("rewindinit");
    let session = create(&*store, &app, &user, "s", json!({"topic": "refunds", "step": 0, "user:tier": "gold"})).await;
    for i in 1..=3 {
        append(&*store, &session.key, ev(json!({ "step": i, format!("only_{i}"): true }))).await;
    }
    let rewound = store.rewind(&session.key, 1, None).await.expect("rewind");
    let expected = obj(json!({"topic": "refunds", "step": 1, "only_1": true, "user:tier": "gold"}));
    assert_eq!(rewound.state, expected, "initial state + the deltas of event 1");

    let emptied = store.rewind(&session.key, 0, None).await.expect("rewind to nothing");
    assert_eq!(emptied.state, obj(json!({"topic": "refunds", "step": 0, "user:tier": "gold"})), "the initial state");

    // A successor starts from the state its predecessor had when it closed.
    append(&*store, &session.key, ev(json!({"step": 9}))).await;
    let successor = store.rollover(&session.key, Some("next".into()), Event::new("summarizer")).await.expect("roll");
    append(&*store, &successor.key, ev(json!({"step": 10}))).await;
    let back = store.rewind(&successor.key, 1, None).await.expect("rewind the successor");
    assert_eq!(back.state, obj(json!({"topic": "refunds", "step": 9, "user:tier": "gold"})));
}

pub async fn rewind_to_the_current_version_changes_nothing<F: StoreFactory>(f: &F) {
    let store = f.store(StoreConfig::default()).await;
    let (app, user) = names("rewindnoop");
    let session = create(&*store, &app, &user, "s", json!({"topic": "a"})).await;
    for i in 1..=3 {
        append(&*store, &session.key, ev(json!({ "step": i }))).await;
    }
    let before = get(&*store, &session.key).await;
    let same = store.rewind(&session.key, 3, Some(3)).await.expect("rewind to the current version");
    assert_eq!(same, before, "state, events, version and update time unchanged");
    let untouched = store.rewind(&session.key, 3, None).await.expect("again, without a version");
    assert_eq!(untouched, before);
}

pub async fn retried_rewind_already_at_its_target_succeeds<F: StoreFactory>(f: &F) {
    let store = f.store(StoreConfig::default()).await;
    let (app, user) = names("rewindretry");
    let session = create(&*store, &app, &user, "s", json!({})).await;
    for i in 1..=5 {
        append(&*store, &session.key, ev(json!({ "step": i }))).await;
    }
    let first = store.rewind(&session.key, 2, Some(5)).await.expect("rewind");
    // The same call again, as a client does when the first reply was lost.
    let retried = store.rewind(&session.key, 2, Some(5)).await.expect("a retried rewind succeeds");
    assert_eq!(retried, first);
    // Once someone appended after the rewind, the retry is stale again.
    append(&*store, &session.key, ev(json!({"step": 6}))).await;
    let stale = store.rewind(&session.key, 2, Some(5)).await;
    assert!(matches!(stale, Err(StoreError::StaleSession { expected: 5, actual: 3, .. })), "{stale:?}");
}

pub async fn retried_rollover_returns_its_successor<F: StoreFactory>(f: &F) {
    let store = f.store(StoreConfig::default()).await;
    let (app, user) = names("rollretry");
    let session = create(&*store, &app, &user, "s", json!({"topic": "a"})).await;
    append(&*store, &session.key, ev(json!({"step": 1}))).await;
    let summary = Event::new("summarizer");
    let successor = store.rollover(&session.key, Some("next".into()), summary.clone()).await.expect("rollover");
    let retried = store.rollover(&session.key, Some("next".into()), summary.clone()).await.expect("retried rollover");
    assert_eq!(retried, successor, "the retry returns the successor it asked for");

    // The successor moved on; a late retry returns it as it is now.
    append(&*store, &successor.key, ev(json!({"step": 2}))).await;
    let late = store.rollover(&session.key, Some("next".into()), summary.clone()).await.expect("late retry");
    assert_eq!(late, get(&*store, &successor.key).await);
    assert_eq!(late.version, 2);

    // Another successor id is not a retry: the session is closed.
    let other = store.rollover(&session.key, Some("other".into()), summary).await;
    assert_eq!(
        other,
        Err(StoreError::SessionClosed { key: session.key.clone(), successor: Some(successor.key.session_id.clone()) })
    );
}
