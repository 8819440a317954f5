//! `redact_event`: one event's content and text replaced by a tombstone,
//! the conversation kept.

use adk_postgres_domain::{RedactOptions, StoreConfig, StoreError};
use serde_json::json;

use super::*;

/// An event carrying user text everywhere an adk event can.
fn pasted_pii() -> Event {
    Event::from_value(json!({
        "id": "pii", "invocation_id": "inv-2", "author": "assistant", "branch": "root.assistant",
        "timestamp": "2026-11-30T10:00:00.123456789Z",
        "content": {"role": "model", "parts": [
            {"text": "your card 4111-1111 is noted"},
            {"functionCall": {"name": "charge", "args": {"pan": "4111-1111"}}}]},
        "actions": {"state_delta": {"card_noted": true, "user:last4": "1111"},
                    "artifact_delta": {"card-4111.png": 1}, "escalate": true,
                    "tool_confirmation": {"hint": "charge 4111-1111?"}},
        "usage_metadata": {"prompt_token_count": 7, "candidates_token_count": 5, "total_token_count": 12},
        "error_code": "SAFETY", "error_message": "refused to store 4111-1111",
        "citation_metadata": {"citation_sources": [{"uri": "https://x/4111-1111"}]},
        "event_metadata": {"note": "4111-1111"}, "llm_request": "{\"q\": \"4111-1111\"}",
        "long_running_tool_ids": ["call-4111"], "finish_reason": "STOP", "turn_complete": true
    }))
    .expect("event")
}

/// The stored JSON of a tombstone without the parts that differ per call
/// (the time) or per store (what the store keeps for its own jobs).
fn tombstone_json(event: &Event) -> Value {
    let mut value = serde_json::to_value(event).expect("json");
    let redaction = value["redaction"].as_object_mut().expect("a redaction");
    redaction.retain(|k, _| k == "reason" || k == "state_delta");
    value
}

async fn three_events(store: &dyn SessionStore, case: &str) -> (Session, Vec<Event>) {
    let (app, user) = names(case);
    let session = create(store, &app, &user, "s", json!({"topic": "billing"})).await;
    let mut events = vec![append(store, &session.key, ev(json!({"step": 1}))).await.event];
    events.push(append(store, &session.key, pasted_pii()).await.event);
    events.push(append(store, &session.key, ev(json!({"step": 3}))).await.event);
    (get(store, &session.key).await, events)
}

pub async fn redact_replaces_content_and_every_text_and_keeps_identity_order_and_state<F: StoreFactory>(f: &F) {
    let store = f.store(StoreConfig::default()).await;
    let (before, events) = three_events(&*store, "redact").await;
    let since = Utc::now() - TimeDelta::milliseconds(1);

    let redacted = store.redact_event(&before.key, "pii", "pasted a card number", RedactOptions::default()).await;
    let redacted = redacted.expect("redact");
    assert_eq!((redacted.seq, redacted.already_redacted), (2, false));
    let after = get(&*store, &before.key).await;
    assert_eq!(after.events[1], redacted.event, "every read sees the tombstone the call returned");
    assert_eq!((after.events[0].clone(), after.events[2].clone()), (events[0].clone(), events[2].clone()));
    assert_eq!(after.version, before.version, "not an append");
    assert_eq!(after.last_update_time, before.last_update_time);
    assert_eq!(after.state, before.state, "the state stays as it is");

    let tombstone = &redacted.event;
    assert!(!serde_json::to_string(tombstone).expect("json").contains("4111"), "{tombstone:?}");
    assert_eq!(
        tombstone_json(tombstone),
        json!({
            "id": "pii", "invocation_id": "inv-2", "author": "assistant", "branch": "root.assistant",
            "timestamp": "2026-11-30T10:00:00.123456789Z",
            "content": {"role": "model", "parts": [{"text": "[redacted]"}]},
            "actions": {"state_delta": {"card_noted": true, "user:last4": "1111"}, "escalate": true},
            "usage_metadata": {"prompt_token_count": 7, "candidates_token_count": 5, "total_token_count": 12},
            "error_code": "SAFETY", "turn_complete": true,
            "redaction": {"reason": "pasted a card number", "state_delta": false}
        }),
        "both stores write exactly this tombstone"
    );
    let at = tombstone.redaction.as_ref().expect("redaction").redacted_at;
    assert!(at >= since && at <= Utc::now(), "redacted at {at}, called after {since}");
    assert_eq!(tombstone.timestamp, events[1].timestamp, "the event's own time stays, to the nanosecond");
}

pub async fn rewind_and_fork_see_the_tombstone_and_rebuild_the_same_state<F: StoreFactory>(f: &F) {
    let store = f.store(StoreConfig::default()).await;
    let (before, _) = three_events(&*store, "redactrewind").await;
    store.redact_event(&before.key, "pii", "pii", RedactOptions::default()).await.expect("redact");

    let fork = store.fork(&before.key, 2, Some("f".into())).await.expect("fork");
    assert!(fork.events[1].is_redacted(), "the fork copies the tombstone");
    assert_eq!(fork.state.get("card_noted"), Some(&json!(true)), "the kept delta is folded");

    let rewound = store.rewind(&before.key, 2, None).await.expect("rewind");
    assert!(rewound.events[1].is_redacted());
    assert_eq!(rewound.state.get("card_noted"), Some(&json!(true)));
    assert_eq!(rewound.state.get("topic"), Some(&json!("billing")));
}

pub async fn redacting_the_state_delta_changes_what_rewind_rebuilds<F: StoreFactory>(f: &F) {
    let store = f.store(StoreConfig::default()).await;
    let (before, _) = three_events(&*store, "redactdelta").await;
    let redacted = store
        .redact_event(&before.key, "pii", "pii", RedactOptions { state_delta: true })
        .await
        .expect("redact with the delta");
    assert!(redacted.event.actions.state_delta.is_empty());
    assert!(redacted.event.redaction.as_ref().is_some_and(|r| r.state_delta));
    assert_eq!(get(&*store, &before.key).await.state, before.state, "the current state is not rebuilt");

    let fork = store.fork(&before.key, 3, Some("f".into())).await.expect("fork");
    assert_eq!(fork.state.get("card_noted"), None, "a fork folds the deltas as stored: {:?}", fork.state);
    let rewound = store.rewind(&before.key, 2, None).await.expect("rewind");
    assert_eq!(rewound.state.get("card_noted"), None, "rewind differs now: {:?}", rewound.state);
    assert_eq!(rewound.state.get("step"), Some(&json!(1)));
    assert_eq!(rewound.state.get("user:last4"), Some(&json!("1111")), "user state is never touched");
}

pub async fn redacting_twice_changes_nothing_unless_it_removes_the_state_delta<F: StoreFactory>(f: &F) {
    let store = f.store(StoreConfig::default()).await;
    let (before, _) = three_events(&*store, "redacttwice").await;
    let first = store.redact_event(&before.key, "pii", "first", RedactOptions::default()).await.expect("first");
    let again = store.redact_event(&before.key, "pii", "second", RedactOptions::default()).await.expect("again");
    assert!(again.already_redacted);
    assert_eq!(again.event, first.event, "the first tombstone stays, reason and time");

    let more = store.redact_event(&before.key, "pii", "delta too", RedactOptions { state_delta: true }).await;
    let more = more.expect("remove the delta");
    assert!(!more.already_redacted);
    assert!(more.event.actions.state_delta.is_empty());
    assert_eq!(more.event.redaction.as_ref().map(|r| r.reason.as_str()), Some("delta too"));
    let last = store.redact_event(&before.key, "pii", "x", RedactOptions { state_delta: true }).await.expect("last");
    assert!(last.already_redacted);
    assert_eq!(get(&*store, &before.key).await.events[1], more.event);
}

pub async fn redact_refuses_bad_input_and_missing_targets_writing_nothing<F: StoreFactory>(f: &F) {
    let store = f.store(StoreConfig::default()).await;
    let (before, _) = three_events(&*store, "redactbad").await;
    let options = RedactOptions::default();
    for reason in ["", "   ", &"r".repeat(257), "line\nbreak"] {
        expect_invalid(store.redact_event(&before.key, "pii", reason, options).await, |f| f == "reason", "reason");
    }
    expect_invalid(store.redact_event(&before.key, " ", "pii", options).await, |f| f == "event_id", "event id");
    match store.redact_event(&before.key, "no-such-event", "pii", options).await {
        Err(StoreError::EventNotFound { key, event_id }) => {
            assert_eq!((key, event_id.as_str()), (before.key.clone(), "no-such-event"));
        }
        other => panic!("a missing event: {other:?}"),
    }
    let missing = key(&before.key.app_name, &before.key.user_id, "nope");
    expect_not_found(store.redact_event(&missing, "pii", "pii", options).await, &missing, "missing session");
    let foreign = key(&before.key.app_name, &other_user(&before.key.user_id), "s");
    expect_not_found(store.redact_event(&foreign, "pii", "pii", options).await, &foreign, "another user's");
    assert_eq!(get(&*store, &before.key).await, before, "nothing was written");
    assert_healthy(&*store, &before.key.app_name).await;
}

pub async fn a_retried_append_of_a_redacted_event_is_a_duplicate_and_appending_a_tombstone_is_refused<
    F: StoreFactory,
>(
    f: &F,
) {
    let store = f.store(StoreConfig::default()).await;
    let (before, events) = three_events(&*store, "redactretry").await;
    let redacted = store.redact_event(&before.key, "pii", "pii", RedactOptions::default()).await.expect("redact");
    // The stored event is no longer the one sent: a late retry must not
    // bring the text back, and is told so.
    match store.append(&before.key, events[1].clone(), AppendOptions::default()).await {
        Err(StoreError::DuplicateEvent { event_id, .. }) => assert_eq!(event_id, "pii"),
        other => panic!("a retry of the redacted event: {other:?}"),
    }
    let mut forged = redacted.event;
    forged.id = "forged".into();
    expect_invalid(
        store.append(&before.key, forged, AppendOptions::default()).await,
        |f| f == "event.redaction",
        "a tombstone appended",
    );
    assert_eq!(get(&*store, &before.key).await.version, 3);
}

pub async fn redactions_racing_appends_lose_no_append_and_keep_seq_gapless<F: StoreFactory>(f: &F) {
    let store = f.store(StoreConfig::default()).await;
    let (app, user) = names("redactrace");
    let session = create(&*store, &app, &user, "s", json!({})).await;
    const WRITERS: usize = 6;
    const EACH: usize = 15;
    let mut tasks = JoinSet::new();
    for w in 0..WRITERS {
        let (store, key) = (Arc::clone(&store), session.key.clone());
        tasks.spawn(async move {
            for i in 0..EACH {
                let mut event = ev(json!({ format!("w{w}"): i }));
                event.id = format!("w{w}-{i}");
                event.content = Some(json!({"role": "user", "parts": [{"text": format!("secret {w} {i}")}]}));
                store.append(&key, event, AppendOptions::default()).await.expect("append");
            }
        });
    }
    let (redactor, key) = (Arc::clone(&store), session.key.clone());
    tasks.spawn(async move {
        // Redacts each writer's even events as they land.
        let mut left: Vec<String> =
            (0..WRITERS).flat_map(|w| (0..EACH).step_by(2).map(move |i| format!("w{w}-{i}"))).collect();
        while !left.is_empty() {
            let id = left.remove(0);
            match redactor.redact_event(&key, &id, "race", RedactOptions::default()).await {
                Ok(done) => assert_eq!(done.event.id, id),
                Err(StoreError::EventNotFound { .. }) => {
                    left.push(id);
                    tokio::task::yield_now().await;
                }
                Err(e) => panic!("redact {id}: {e}"),
            }
        }
    });
    while let Some(joined) = tasks.join_next().await {
        joined.expect("task");
    }
    let after = get(&*store, &session.key).await;
    assert_eq!(after.version, (WRITERS * EACH) as u64, "no append was lost");
    assert_eq!(after.events.len(), WRITERS * EACH);
    for (w, i) in (0..WRITERS).flat_map(|w| (0..EACH).map(move |i| (w, i))) {
        let event = after.events.iter().find(|e| e.id == format!("w{w}-{i}")).expect("every append is there");
        assert_eq!(event.is_redacted(), i % 2 == 0, "{}", event.id);
        assert_eq!(after.state.get(&format!("w{w}")), Some(&json!(EACH - 1)), "each writer's last delta");
    }
}
