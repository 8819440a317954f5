//! `erase_user`: every session of the user (expired ones too), their events
//! and the user's state go; app state and every other user's data stay; a
//! second erasure finds nothing; appends racing it are erased or refused.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use adk_postgres_domain::{AppendOptions, CreateSession, Erasure, Event, GetOptions, StoreConfig, StoreError, UserId};
use serde_json::json;
use tokio::sync::Notify;

use super::*;

pub async fn erase_user_removes_every_session_event_and_the_user_state<F: StoreFactory>(f: &F) {
    let store = f.store(StoreConfig::default()).await;
    let (app, user) = names("erase");
    let neighbour = other_user(&user);
    let elsewhere = other_app(&app);

    let talk = create(&*store, &app, &user, "talk", json!({"topic": "private"})).await;
    append(&*store, &talk.key, ev(json!({"user:plan": "pro", "app:motd": "hello", "note": "secret"}))).await;
    append(&*store, &talk.key, Event::new("agent")).await;
    append(&*store, &talk.key, Event::new("agent")).await;
    let empty = create(&*store, &app, &user, "empty", json!({})).await;
    // Expired, not purged yet: erased and counted all the same.
    let expired = store
        .create(CreateSession::new(app.clone(), user.clone()).with_id("expired").with_ttl(Duration::from_millis(200)))
        .await
        .expect("create a short-lived session");
    append(&*store, &expired.key, Event::new("agent")).await;
    tokio::time::sleep(Duration::from_millis(400)).await;

    // What stays: another user of the app, the same user id in another app.
    let theirs = create(&*store, &app, &neighbour, "talk", json!({})).await;
    append(&*store, &theirs.key, ev(json!({"user:plan": "basic"}))).await;
    let there = create(&*store, &elsewhere, &user, "talk", json!({})).await;
    append(&*store, &there.key, ev(json!({"user:plan": "other app"}))).await;

    let erased = store.erase_user(&app, &user).await.expect("erase the user");
    assert_eq!(erased, Erasure { sessions: 3, events: 4, user_state: true });

    for key in [&talk.key, &empty.key, &expired.key] {
        expect_not_found(store.get(key, GetOptions::default()).await, key, "get after the erasure");
        expect_not_found(
            store.append(key, Event::new("agent"), AppendOptions::default()).await,
            key,
            "append after the erasure",
        );
    }
    assert!(list_all(&*store, &app, &user).await.is_empty(), "no session of the user is listed");

    // The neighbour keeps everything, app state included.
    let kept = get(&*store, &theirs.key).await;
    assert_eq!(kept.events.len(), 1);
    assert_eq!(kept.state, obj(json!({"user:plan": "basic", "app:motd": "hello"})), "app state stays");
    // The same user id in another app is another user.
    let kept = get(&*store, &there.key).await;
    assert_eq!((kept.events.len(), kept.state), (1, obj(json!({"user:plan": "other app"}))));
}

pub async fn a_second_erasure_and_an_unknown_user_erase_nothing<F: StoreFactory>(f: &F) {
    let store = f.store(StoreConfig::default()).await;
    let (app, user) = names("eraseagain");
    let session = create(&*store, &app, &user, "s", json!({})).await;
    append(&*store, &session.key, ev(json!({"user:k": 1}))).await;
    assert_eq!(store.erase_user(&app, &user).await, Ok(Erasure { sessions: 1, events: 1, user_state: true }));
    assert_eq!(store.erase_user(&app, &user).await, Ok(Erasure::default()), "a second erasure finds nothing");
    let stranger = other_user(&user);
    assert_eq!(store.erase_user(&app, &stranger).await, Ok(Erasure::default()), "a user never seen");
    assert_eq!(store.erase_user(&other_app(&app), &user).await, Ok(Erasure::default()), "an app never seen");
    assert_healthy(&*store, &app).await;
}

pub async fn erased_session_ids_are_free_and_nothing_comes_back<F: StoreFactory>(f: &F) {
    let store = f.store(StoreConfig::default()).await;
    let (app, user) = names("erasereuse");
    let old = create(&*store, &app, &user, "again", json!({"old": true})).await;
    let first = ev(json!({"user:name": "Ada", "app:shared": 1, "local": 1}));
    append(&*store, &old.key, first.clone()).await;
    append(&*store, &old.key, Event::new("agent")).await;
    store.erase_user(&app, &user).await.expect("erase");

    let fresh = create(&*store, &app, &user, "again", json!({})).await;
    assert_eq!(fresh.key, old.key);
    assert_eq!((fresh.version, fresh.events.len()), (0, 0), "nothing of the old session comes back");
    assert_eq!(fresh.state, obj(json!({"app:shared": 1})), "app state stays, user state is gone");
    // The old first event's id is unused: it stores as new, not a replay.
    let answer = append(&*store, &fresh.key, first).await;
    assert_eq!((answer.seq, answer.replayed), (Some(1), false));
    assert_eq!(session_ids(&list_all(&*store, &app, &user).await), ["again"]);
}

pub async fn erase_user_matches_the_user_id_exactly<F: StoreFactory>(f: &F) {
    let store = f.store(StoreConfig::default()).await;
    let (app, _) = names("eraseexact");
    // Wildcards, quotes, case and spaces are part of the id.
    let users = ["u%", "u_x", "U%", "u% ", " u%", "u%x", "ux", "o'brien", "a\\b"];
    let mut keys = Vec::new();
    for (i, user) in users.iter().enumerate() {
        let user = UserId::new(*user).expect("user id");
        let session = create(&*store, &app, &user, &format!("s{i}"), json!({})).await;
        append(&*store, &session.key, ev(json!({ "user:who": i }))).await;
        keys.push(session.key);
    }
    let erased = store.erase_user(&app, &UserId::new("u%").expect("user id")).await.expect("erase u%");
    assert_eq!(erased, Erasure { sessions: 1, events: 1, user_state: true });
    expect_not_found(store.get(&keys[0], GetOptions::default()).await, &keys[0], "the erased user");
    for (i, key) in keys.iter().enumerate().skip(1) {
        let kept = get(&*store, key).await;
        assert_eq!(kept.state, obj(json!({ "user:who": i })), "user {:?} is untouched", users[i]);
    }
}

pub async fn appends_racing_an_erasure_land_before_it_or_are_not_found<F: StoreFactory>(f: &F) {
    let store = f.store(StoreConfig::default()).await;
    let (app, user) = names("eraserace");
    let mut keys = Vec::new();
    for id in ["a", "b", "c", "d"] {
        keys.push(create(&*store, &app, &user, id, json!({})).await.key);
    }
    let acknowledged = Arc::new(AtomicU64::new(0));
    let warmed_up = Arc::new(Notify::new());
    let mut appenders = JoinSet::new();
    for (i, key) in keys.iter().cycle().take(8).enumerate() {
        let (store, key, acknowledged, warmed_up) =
            (Arc::clone(&store), key.clone(), Arc::clone(&acknowledged), Arc::clone(&warmed_up));
        appenders.spawn(async move {
            for n in 0u64.. {
                let event = ev(json!({ format!("user:w{i}"): n, "n": n }));
                match store.append(&key, event, AppendOptions::default()).await {
                    Ok(appended) => {
                        assert!(appended.seq.is_some() && !appended.replayed, "{appended:?}");
                        if acknowledged.fetch_add(1, Ordering::SeqCst) + 1 == 40 {
                            warmed_up.notify_one();
                        }
                    }
                    // The session was hidden: every later append is refused too.
                    Err(StoreError::NotFound(missing)) => {
                        assert_eq!(missing, key);
                        return;
                    }
                    Err(other) => panic!("append racing an erasure: {other:?}"),
                }
            }
        });
    }
    warmed_up.notified().await;
    let erased = store.erase_user(&app, &user).await.expect("erase while appends run");
    while let Some(done) = appenders.join_next().await {
        done.expect("appender");
    }
    // Every acknowledged append landed before its session was hidden, and
    // went with it; the appenders stop only at NotFound, so none is pending.
    assert_eq!(erased.sessions, 4);
    assert_eq!(erased.events, acknowledged.load(Ordering::SeqCst), "every acknowledged event was erased");
    assert!(erased.user_state);
    for key in &keys {
        expect_not_found(store.get(key, GetOptions::default()).await, key, "get after the race");
    }
    assert!(list_all(&*store, &app, &user).await.is_empty());
    assert_eq!(store.erase_user(&app, &user).await, Ok(Erasure::default()), "nothing was left behind");
}
