//! `delete`: idempotent, and what it leaves behind.

use adk_postgres_domain::{Event, GetOptions, StoreConfig};
use serde_json::json;

use super::*;

pub async fn delete_is_idempotent<F: StoreFactory>(f: &F) {
    let store = f.store(StoreConfig::default()).await;
    let (app, user) = names("deleteidem");
    let never = key(&app, &user, "never");
    store.delete(&never).await.expect("deleting a never-created session");
    store.delete(&never).await.expect("and again");
    let session = create(&*store, &app, &user, "s", json!({})).await;
    append(&*store, &session.key, Event::new("agent")).await;
    store.delete(&session.key).await.expect("delete");
    store.delete(&session.key).await.expect("delete again");
    expect_not_found(store.get(&session.key, GetOptions::default()).await, &session.key, "get deleted");
    assert!(list_all(&*store, &app, &user).await.is_empty());
}

pub async fn delete_removes_events_and_keeps_app_and_user_state<F: StoreFactory>(f: &F) {
    let store = f.store(StoreConfig::default()).await;
    let (app, user) = names("delete");
    let gone = create(&*store, &app, &user, "gone", json!({"s": 1})).await;
    let first = ev(json!({"user:kept": 1, "app:kept": 2, "local": 3}));
    append(&*store, &gone.key, first.clone()).await;
    append(&*store, &gone.key, Event::new("agent")).await;
    append(&*store, &gone.key, Event::new("agent")).await;
    let stays = create(&*store, &app, &user, "stays", json!({})).await;

    store.delete(&gone.key).await.expect("delete");
    expect_not_found(store.get(&gone.key, GetOptions::default()).await, &gone.key, "get deleted");
    assert_eq!(session_ids(&list_all(&*store, &app, &user).await), ["stays"]);
    let shared = obj(json!({"user:kept": 1, "app:kept": 2}));
    assert_eq!(get(&*store, &stays.key).await.state, shared, "app and user state stay");

    // The id is free again, and nothing of the old session comes back.
    let again = create(&*store, &app, &user, "gone", json!({})).await;
    assert_eq!((again.version, again.events.len(), &again.state), (0, 0, &shared));
    let loaded = get(&*store, &again.key).await;
    assert_eq!((loaded.version, loaded.events.len()), (0, 0), "the events went with the session");
    // The old first event's id is unused: it stores as new, not a replay.
    let answer = append(&*store, &again.key, first).await;
    assert_eq!((answer.seq, answer.replayed), (Some(1), false));
    assert_eq!(get(&*store, &again.key).await.events.len(), 1);
}
