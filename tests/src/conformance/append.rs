//! `append`: what is stored, sequence numbers, state merges, retries,
//! versions and the lifetime limit.

use std::time::Duration;

use adk_postgres_domain::{AppendOptions, Appended, Event, State, StoreConfig, StoreError};
use serde_json::{Value, json};

use super::*;

pub async fn append_does_not_store_partial_events<F: StoreFactory>(f: &F) {
    let store = f.store(StoreConfig::default()).await;
    let (app, user) = names("partial");
    let session = create(&*store, &app, &user, "s", json!({})).await;
    let mut chunk = ev(json!({"a": 1, "user:p": 1, "app:p": 1, "temp:t": 1}));
    chunk.partial = Some(true);
    let answer = append(&*store, &session.key, chunk.clone()).await;
    assert_eq!(answer, Appended { event: chunk, seq: None, replayed: false, last_update_time: None, lease: None });
    let loaded = get(&*store, &session.key).await;
    assert_eq!(loaded, session, "a partial event changes nothing");
    let sibling = create(&*store, &app, &user, "sibling", json!({})).await;
    assert_eq!(sibling.state, State::new(), "nor the shared scopes");

    let mut done = ev(json!({"a": 2}));
    done.partial = Some(false);
    assert_eq!(append(&*store, &session.key, done).await.seq, Some(1), "partial: false is stored");
}

pub async fn append_strips_temp_keys<F: StoreFactory>(f: &F) {
    let store = f.store(StoreConfig::default()).await;
    let (app, user) = names("temp");
    let session = create(&*store, &app, &user, "s", json!({})).await;
    let event = ev(json!({"temp:scratch": "x", "kept": 1, "user:u": 2, "app:a": 3, "temp:other": {"y": 1}}));
    let answer = append(&*store, &session.key, event.clone()).await;
    let without = obj(json!({"kept": 1, "user:u": 2, "app:a": 3}));
    assert_eq!(answer.event.actions.state_delta, without, "the answer carries the stored delta");
    assert_eq!(answer.event.id, event.id);
    let loaded = get(&*store, &session.key).await;
    assert_eq!(loaded.events[0].actions.state_delta, without, "the stored event has no temp: keys");
    assert_eq!(loaded.state, without, "nor does the state");
    let sibling = create(&*store, &app, &user, "sibling", json!({})).await;
    assert_eq!(sibling.state, obj(json!({"user:u": 2, "app:a": 3})));
}

pub async fn append_assigns_gapless_sequence_numbers<F: StoreFactory>(f: &F) {
    let store = f.store(StoreConfig::default()).await;
    let (app, user) = names("seq");
    let session = create(&*store, &app, &user, "s", json!({})).await;
    let other = create(&*store, &app, &user, "other", json!({})).await;
    for expected in 1..=5u64 {
        let answer = append(&*store, &session.key, Event::new("agent")).await;
        assert_eq!((answer.seq, answer.replayed), (Some(expected), false));
        assert!(answer.last_update_time.is_some());
    }
    assert_eq!(append(&*store, &other.key, Event::new("agent")).await.seq, Some(1), "seq is per session");
    let loaded = get(&*store, &session.key).await;
    assert_eq!((loaded.version, loaded.events.len()), (5, 5));
    assert_eq!(get(&*store, &other.key).await.version, 1);
}

pub async fn append_merges_state_deltas_shallowly<F: StoreFactory>(f: &F) {
    let store = f.store(StoreConfig::default()).await;
    let (app, user) = names("merge");
    let session = create(
        &*store,
        &app,
        &user,
        "s",
        json!({"nested": {"x": 1, "y": 2}, "gone": 1, "keep": "k", "user:nested": {"p": 1, "q": 2}, "user:gone": 1}),
    )
    .await;
    append(
        &*store,
        &session.key,
        ev(json!({"nested": {"x": 9}, "gone": null, "user:nested": {"p": 9}, "user:gone": null, "new": [1, 2]})),
    )
    .await;
    let expected = obj(json!({
        "nested": {"x": 9}, "gone": null, "keep": "k", "new": [1, 2], "user:nested": {"p": 9}, "user:gone": null
    }));
    let loaded = get(&*store, &session.key).await;
    assert_eq!(loaded.state, expected, "a value replaces (no deep merge) and JSON null is stored");
    assert_eq!(loaded.state.get("gone"), Some(&Value::Null), "null is a stored value, not a deletion");

    let answer = append(&*store, &session.key, ev(json!({}))).await;
    assert_eq!(answer.seq, Some(2));
    let loaded = get(&*store, &session.key).await;
    assert_eq!((loaded.version, &loaded.state), (2, &expected), "an empty delta leaves the state");
}

pub async fn append_routes_app_and_user_deltas_to_their_scopes<F: StoreFactory>(f: &F) {
    let store = f.store(StoreConfig::default()).await;
    let (app, user) = names("scopes");
    let a = create(&*store, &app, &user, "a", json!({})).await;
    let b = create(&*store, &app, &user, "b", json!({})).await;
    let c = create(&*store, &app, &other_user(&user), "c", json!({})).await;
    let d = create(&*store, &other_app(&app), &user, "d", json!({})).await;
    append(&*store, &a.key, ev(json!({"app:theme": "dark", "user:lang": "fr", "mine": 1}))).await;

    let expect = [
        (&a, json!({"app:theme": "dark", "user:lang": "fr", "mine": 1})),
        (&b, json!({"app:theme": "dark", "user:lang": "fr"})),
        (&c, json!({"app:theme": "dark"})),
        (&d, json!({})),
    ];
    for (session, state) in expect {
        assert_eq!(get(&*store, &session.key).await.state, obj(state), "{}", session.key);
    }
    // A user delta from another user's session does not reach this user.
    append(&*store, &c.key, ev(json!({"user:lang": "de", "app:theme": "light"}))).await;
    assert_eq!(get(&*store, &b.key).await.state, obj(json!({"app:theme": "light", "user:lang": "fr"})));
    assert_eq!(get(&*store, &c.key).await.state, obj(json!({"app:theme": "light", "user:lang": "de"})));
}

pub async fn append_update_time_never_moves_backwards<F: StoreFactory>(f: &F) {
    let store = f.store(StoreConfig::default()).await;
    let (app, user) = names("clock");
    let session = create(&*store, &app, &user, "s", json!({})).await;
    let mut previous = session.last_update_time;
    for _ in 0..20 {
        let answer = append(&*store, &session.key, Event::new("agent")).await;
        let at = answer.last_update_time.expect("a stored append reports its update time");
        assert!(at >= previous, "update time went back from {previous} to {at}");
        previous = at;
    }
    let loaded = get(&*store, &session.key).await;
    assert_eq!(loaded.last_update_time, previous, "get reports the last append's update time");
    assert_eq!(loaded.created_at, session.created_at, "created_at never moves");
    assert!(loaded.last_update_time > session.created_at, "appends move the update time");
}

pub async fn append_retry_of_a_stored_event_is_replayed<F: StoreFactory>(f: &F) {
    let store = f.store(StoreConfig::default()).await;
    let (app, user) = names("replay");
    let session = create(&*store, &app, &user, "s", json!({})).await;
    let first = ev(json!({"n": 1, "user:seen": 1, "temp:t": 1}));
    let stored = append(&*store, &session.key, first.clone()).await;
    assert_eq!((stored.seq, stored.replayed), (Some(1), false));
    let second = append(&*store, &session.key, ev(json!({"n": 2, "user:seen": 2}))).await;
    assert_eq!(second.seq, Some(2));

    let retry = append(&*store, &session.key, first.clone()).await;
    assert!(retry.replayed, "a retry is reported as a replay");
    assert_eq!(retry.seq, Some(1), "with the stored seq");
    assert_eq!(retry.event, stored.event, "and the stored event");
    // A retry carries the options of the first attempt.
    let retry = append_expecting(&*store, &session.key, first.clone(), 0).await.expect("retry with its version");
    assert_eq!((retry.replayed, retry.seq), (true, Some(1)));

    let loaded = get(&*store, &session.key).await;
    assert_eq!(loaded.version, 2, "nothing was added");
    assert_eq!(loaded.events, vec![stored.event, second.event]);
    assert_eq!(loaded.state, obj(json!({"n": 2, "user:seen": 2})), "the retry's delta was not applied again");
}

pub async fn append_same_id_with_different_content_is_duplicate_event<F: StoreFactory>(f: &F) {
    let store = f.store(StoreConfig::default()).await;
    let (app, user) = names("dupevent");
    let session = create(&*store, &app, &user, "s", json!({})).await;
    let original = ev(json!({"n": 1}));
    let stored = append(&*store, &session.key, original.clone()).await.event;

    let mut other_content = original.clone();
    other_content.content = Some(json!({"parts": [{"text": "different"}]}));
    other_content.actions.state_delta = obj(json!({"n": 99, "user:x": 1}));
    let mut other_time = original.clone();
    other_time.timestamp += ns(1);
    let mut other_author = original.clone();
    other_author.author = "someone-else".into();
    for changed in [other_content, other_time, other_author] {
        let result = store.append(&session.key, changed, AppendOptions::default()).await;
        assert!(
            matches!(&result, Err(StoreError::DuplicateEvent { key, event_id }) if *key == session.key && *event_id == original.id),
            "{result:?}"
        );
    }
    let loaded = get(&*store, &session.key).await;
    assert_eq!((loaded.version, loaded.events), (1, vec![stored]));
    assert_eq!(loaded.state, obj(json!({"n": 1})), "nothing of the duplicate was applied");
}

pub async fn append_expected_version_detects_stale_sessions<F: StoreFactory>(f: &F) {
    let store = f.store(StoreConfig::default()).await;
    let (app, user) = names("stale");
    let session = create(&*store, &app, &user, "s", json!({})).await;
    let first = append_expecting(&*store, &session.key, Event::new("agent"), 0).await.expect("expected 0 at 0");
    assert_eq!(first.seq, Some(1));

    let late = ev(json!({"x": 1, "user:x": 1, "app:x": 1}));
    for expected in [0, 7] {
        let result = append_expecting(&*store, &session.key, late.clone(), expected).await;
        assert!(
            matches!(&result, Err(StoreError::StaleSession { key, expected: e, actual: 1 }) if *key == session.key && *e == expected),
            "expected {expected}: {result:?}"
        );
    }
    let loaded = get(&*store, &session.key).await;
    assert_eq!(loaded.version, 1, "nothing written");
    assert_eq!(ids(&loaded.events), vec![first.event.id.clone()]);
    assert_eq!(loaded.state, State::new(), "no delta of a stale append, in any scope");

    // The refused event was not stored: it appends as new, not as a replay.
    let now = append_expecting(&*store, &session.key, late, 1).await.expect("expected 1 at 1");
    assert_eq!((now.seq, now.replayed), (Some(2), false));
    assert_eq!(append(&*store, &session.key, Event::new("agent")).await.seq, Some(3), "no expectation");
}

pub async fn append_to_a_missing_session_is_not_found<F: StoreFactory>(f: &F) {
    let store = f.store(StoreConfig::default()).await;
    let (app, user) = names("appendmissing");
    let missing = key(&app, &user, "missing");
    expect_not_found(
        store.append(&missing, ev(json!({"user:x": 1})), AppendOptions::default()).await,
        &missing,
        "append",
    );
    expect_not_found(append_expecting(&*store, &missing, Event::new("agent"), 0).await, &missing, "append");
    let deleted = create(&*store, &app, &user, "deleted", json!({})).await;
    store.delete(&deleted.key).await.expect("delete");
    expect_not_found(
        store.append(&deleted.key, Event::new("agent"), AppendOptions::default()).await,
        &deleted.key,
        "append",
    );
    // Nothing of the refused appends was written anywhere.
    let fresh = create(&*store, &app, &user, "fresh", json!({})).await;
    assert_eq!(fresh.state, State::new());
    assert_eq!(session_ids(&list_all(&*store, &app, &user).await), vec!["fresh".to_owned()]);
}

pub async fn append_past_the_max_lifetime_is_refused<F: StoreFactory>(f: &F) {
    let lifetime = Duration::from_millis(1000);
    let store = f
        .store(StoreConfig { default_ttl: None, max_session_lifetime: Some(lifetime), ..StoreConfig::default() })
        .await;
    let (app, user) = names("lifetime");
    let session = create(&*store, &app, &user, "s", json!({})).await;
    let first = ev(json!({"n": 1}));
    let stored = append(&*store, &session.key, first.clone()).await;
    assert_eq!(stored.seq, Some(1), "young sessions take appends");

    tokio::time::sleep(lifetime + Duration::from_millis(300)).await;
    let result = store.append(&session.key, ev(json!({"n": 2, "user:n": 2})), AppendOptions::default()).await;
    assert!(
        matches!(&result, Err(StoreError::LifetimeExceeded { key, max_lifetime }) if *key == session.key && *max_lifetime == lifetime),
        "{result:?}"
    );
    let loaded = get(&*store, &session.key).await;
    assert_eq!((loaded.version, loaded.state), (1, obj(json!({"n": 1}))), "still readable, nothing written");
    // A retry of an append that was stored in time is still answered.
    let retry = append(&*store, &session.key, first).await;
    assert_eq!((retry.replayed, retry.seq), (true, Some(1)));
    // New sessions are young again.
    let young = create(&*store, &app, &user, "young", json!({})).await;
    assert_eq!(append(&*store, &young.key, Event::new("agent")).await.seq, Some(1));
}
