//! `fork`: a new session from the first N events of another.

use std::time::Duration;

use adk_postgres_domain::{Event, GetOptions, SessionMetadata, StoreConfig, StoreError};
use serde_json::json;

use super::*;

pub async fn fork_copies_the_first_events_and_rebuilds_session_state<F: StoreFactory>(f: &F) {
    let store = f.store(StoreConfig::default()).await;
    let (app, user) = names("fork");
    let original = create(&*store, &app, &user, "s", json!({"topic": "refunds", "user:tier": "gold"})).await;
    let mut appended = Vec::new();
    for i in 1..=5 {
        let delta = json!({ "step": i, format!("only_{i}"): true, "user:seen": i, "temp:scratch": i });
        appended.push(append(&*store, &original.key, ev(delta)).await.event);
    }
    let before = get(&*store, &original.key).await;

    let fork = store.fork(&original.key, 3, Some("f".into())).await.expect("fork");
    assert_eq!(fork.key, key(&app, &user, "f"));
    assert_eq!(fork.version, 3, "the fork's version is its number of events");
    assert_eq!(fork.events, appended[..3].to_vec(), "copies of events 1..=3, ids and content unchanged");
    assert_eq!(fork.state.get("topic"), Some(&json!("refunds")), "the original's initial state");
    assert_eq!(fork.state.get("step"), Some(&json!(3)));
    assert!(fork.state.get("only_4").is_none(), "state of an event after the fork point: {:?}", fork.state);
    assert_eq!(fork.state.get("user:seen"), Some(&json!(5)), "user state is shared, not forked");
    assert!(fork.state.keys().all(|k| !k.starts_with("temp:")));
    assert_eq!(fork.closed_at, None);
    assert_eq!(get(&*store, &fork.key).await, fork, "the fork is what a later read sees");
    assert_eq!(get(&*store, &original.key).await, before, "forking left the original as it was");
}

pub async fn fork_and_original_diverge_independently<F: StoreFactory>(f: &F) {
    let store = f.store(StoreConfig::default()).await;
    let (app, user) = names("forkdiverge");
    let original = create(&*store, &app, &user, "s", json!({})).await;
    let shared: Vec<Event> = {
        let mut events = Vec::new();
        for i in 1..=2 {
            events.push(append(&*store, &original.key, ev(json!({ "branch": "trunk", "i": i }))).await.event);
        }
        events
    };
    let fork = store.fork(&original.key, 2, Some("f".into())).await.expect("fork");

    let on_fork = append(&*store, &fork.key, ev(json!({ "branch": "fork" }))).await;
    assert_eq!(on_fork.seq, Some(3), "the fork's sequence continues from the fork point");
    let on_original = append(&*store, &original.key, ev(json!({ "branch": "original" }))).await;
    assert_eq!(on_original.seq, Some(3));
    // An event id of the shared history is a replay on either side, not a duplicate.
    let replayed = append(&*store, &fork.key, shared[0].clone()).await;
    assert!(replayed.replayed);
    assert_eq!(replayed.seq, Some(1));

    let fork_now = get(&*store, &fork.key).await;
    let original_now = get(&*store, &original.key).await;
    assert_eq!(fork_now.state.get("branch"), Some(&json!("fork")));
    assert_eq!(original_now.state.get("branch"), Some(&json!("original")));
    assert_eq!(ids(&fork_now.events)[..2], ids(&original_now.events)[..2]);
    assert_ne!(fork_now.events[2].id, original_now.events[2].id);

    store.rewind(&fork.key, 1, None).await.expect("rewind the fork");
    assert_eq!(get(&*store, &original.key).await.version, 3, "rewinding the fork leaves the original");
    store.delete(&original.key).await.expect("delete the original");
    let survivor = get(&*store, &fork.key).await;
    assert_eq!(survivor.version, 1, "deleting the original leaves the fork");
    assert_eq!(survivor.events, shared[..1].to_vec());
}

pub async fn fork_at_zero_or_at_the_end_and_with_a_generated_id<F: StoreFactory>(f: &F) {
    let store = f.store(StoreConfig::default()).await;
    let (app, user) = names("forkends");
    let original = create(&*store, &app, &user, "s", json!({"start": 1})).await;
    for i in 1..=2 {
        append(&*store, &original.key, ev(json!({ "i": i }))).await;
    }
    let empty = store.fork(&original.key, 0, Some("empty".into())).await.expect("fork at 0");
    assert!(empty.events.is_empty());
    assert_eq!(empty.version, 0);
    assert_eq!(empty.state, obj(json!({"start": 1})), "only the initial state");

    let whole = store.fork(&original.key, 2, None).await.expect("fork at the end with a generated id");
    assert!(uuid::Uuid::parse_str(whole.key.session_id.as_str()).is_ok(), "a generated id is a UUID");
    assert_eq!(whole.version, 2);
    assert_eq!(whole.state, get(&*store, &original.key).await.state);
    let listed = session_ids(&list_all(&*store, &app, &user).await);
    assert_eq!(listed.len(), 3, "both forks are listed: {listed:?}");
}

pub async fn fork_refuses_bad_points_taken_ids_and_missing_sessions<F: StoreFactory>(f: &F) {
    let store = f.store(StoreConfig::default()).await;
    let (app, user) = names("forkbad");
    let original = create(&*store, &app, &user, "s", json!({})).await;
    create(&*store, &app, &user, "taken", json!({"mine": true})).await;
    append(&*store, &original.key, ev(json!({ "i": 1 }))).await;

    expect_invalid(store.fork(&original.key, 2, Some("f".into())).await, |f| f == "at_seq", "fork past the end");
    let taken = store.fork(&original.key, 1, Some("taken".into())).await;
    assert!(
        matches!(&taken, Err(StoreError::AlreadyExists(k)) if *k == key(&app, &user, "taken")),
        "fork onto a taken id: {taken:?}"
    );
    assert_eq!(get(&*store, &key(&app, &user, "taken")).await.state, obj(json!({"mine": true})), "not overwritten");
    let same = store.fork(&original.key, 1, Some("s".into())).await;
    assert!(matches!(same, Err(StoreError::AlreadyExists(_))), "fork onto itself: {same:?}");
    let missing = key(&app, &user, "missing");
    expect_not_found(store.fork(&missing, 0, Some("f".into())).await, &missing, "fork of a missing session");
    let foreign = key(&app, &other_user(&user), "s");
    expect_not_found(store.fork(&foreign, 0, Some("f".into())).await, &foreign, "fork of another user's session");
    expect_invalid(store.fork(&original.key, 1, Some("x\u{0}y".into())).await, |f| f == "session_id", "bad new id");
    expect_not_found(store.get(&key(&app, &user, "f"), GetOptions::default()).await, &key(&app, &user, "f"), "get");
}

pub async fn fork_of_a_closed_session_is_open_and_expired_ones_are_not_found<F: StoreFactory>(f: &F) {
    let ttl = Duration::from_millis(500);
    let store =
        f.store(StoreConfig { default_ttl: Some(ttl), max_session_lifetime: None, ..StoreConfig::default() }).await;
    let (app, user) = names("forkclosed");
    let original = store
        .create(CreateSession::new(app.clone(), user.clone()).with_id("s").with_ttl(Duration::from_secs(3600)))
        .await
        .expect("create");
    append(&*store, &original.key, ev(json!({ "i": 1 }))).await;
    store.rollover(&original.key, Some("next".into()), Event::new("agent")).await.expect("rollover");
    let fork = store.fork(&original.key, 1, Some("f".into())).await.expect("fork of a closed session");
    assert_eq!(fork.closed_at, None, "a fork starts open");
    assert_eq!(fork.expires_at, Some(fork.created_at + TimeDelta::milliseconds(500)), "the store's default ttl");
    append(&*store, &fork.key, ev(json!({ "i": 2 }))).await;

    tokio::time::sleep(ttl + Duration::from_millis(400)).await;
    let expired = key(&app, &user, "next");
    expect_not_found(store.fork(&expired, 1, Some("g".into())).await, &expired, "fork of an expired session");
    // The expired fork's id is free at once, as for create.
    let again = store.fork(&original.key, 1, Some("f".into())).await.expect("fork onto an expired id");
    assert_eq!(again.version, 1);
}

pub async fn fork_copies_the_display_name_and_labels<F: StoreFactory>(f: &F) {
    let store = f.store(StoreConfig::default()).await;
    let (app, user) = names("forkmeta");
    let metadata = SessionMetadata::new().with_display_name("Trip planning").with_label("team", "travel");
    let original = store
        .create(CreateSession::new(app.clone(), user.clone()).with_id("s").with_metadata(metadata.clone()))
        .await
        .expect("create with metadata");
    append(&*store, &original.key, ev(json!({ "i": 1 }))).await;
    let fork = store.fork(&original.key, 1, Some("f".into())).await.expect("fork");
    assert_eq!(fork.metadata, metadata, "the fork carries the original's display name and labels");
    let renamed = SessionMetadata::new().with_display_name("Plan B");
    store.set_metadata(&fork.key, renamed.clone()).await.expect("rename the fork");
    assert_eq!(get(&*store, &fork.key).await.metadata, renamed);
    assert_eq!(get(&*store, &original.key).await.metadata, metadata, "renaming the fork leaves the original");
}
